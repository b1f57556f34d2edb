"""Samples no reward function scores (``scored`` False): left out of their group's statistics, advantage 0,
a group with fewer than 2 scored samples 0 throughout (TRL's nanmean / nanstd, NaN -> 0). By hand for grpo,
and for every built-in estimator against the same estimator on the scored rows alone."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_grpo.core import ADVANTAGES, REWARD_AGGREGATIONS, AdvantageSpec, Variant

#: the package's estimators (other tests may register their own in the shared registry)
BUILT_IN = [n for n in ADVANTAGES.names() if ADVANTAGES.get(n).__module__.startswith("lightning_grpo.")]


def _params(name: str, lengths: torch.Tensor) -> dict:
    return {"lengths": lengths} if ADVANTAGES.spec(name).needs_lengths else {}


def test_grpo_group_of_four_with_one_unscored_by_hand():
    """Rewards [1, None, 0, 1]: mean 2/3 and Bessel std sqrt(1/3) over [1, 0, 1]; the None row gets 0.
    Kept at 0 instead (``scored`` None): mean 1/2, std sqrt(1/3) over [1, 0, 0, 1]."""
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])  # the None scores 0 in the weighted sum
    scored = torch.tensor([True, False, True, True])
    std = math.sqrt(((1 / 3) ** 2 * 2 + (2 / 3) ** 2) / 2)  # = sqrt(1/3)
    expected = torch.tensor([1 / 3, 0.0, -2 / 3, 1 / 3]) / (std + 1e-6)
    torch.testing.assert_close(ADVANTAGES.get("grpo")(rewards, 4, scored=scored), expected, rtol=0, atol=1e-6)
    kept = torch.tensor([0.5, -0.5, -0.5, 0.5]) / (math.sqrt(1 / 3) + 1e-6)
    torch.testing.assert_close(ADVANTAGES.get("grpo")(rewards, 4), kept, rtol=0, atol=1e-6)
    # through the aggregation, two reward functions: the row neither scores is the same row
    two = torch.stack([rewards, torch.zeros(4)], dim=1)  # [B, 2]
    out = REWARD_AGGREGATIONS.get("sum_then_normalize")(two, [1.0, 0.5], 4, "grpo", scored=scored)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)


def test_rloo_counts_only_the_scored_in_the_leave_one_out_mean():
    """[1, None, 0, 1]: A_0 = 1 - mean(0, 1) = 0.5, A_2 = 0 - mean(1, 1) = -1, A_3 = 0.5."""
    out = ADVANTAGES.get("rloo")(torch.tensor([1.0, 0.0, 0.0, 1.0]), 4, scored=torch.tensor([True, False, True, True]))
    torch.testing.assert_close(out, torch.tensor([0.5, 0.0, -1.0, 0.5]), rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_estimator_equals_itself_on_the_scored_rows_alone(name):
    """Groups of 5 with exactly 3 scored each (random places): the masked estimate on the scored rows equals
    the estimator run on those rows alone as groups of 3 (batch statistics included), 0 on the others."""
    assert ADVANTAGES.spec(name).takes_scored, name
    gen = torch.Generator().manual_seed(7)
    P, G, n = 6, 5, 3
    rewards = torch.randint(0, 4, (P * G,), generator=gen).float() / 2  # ties and all-equal groups happen
    rewards[:G] = 1.0  # one all-equal group for certain
    scored = torch.zeros(P, G, dtype=torch.bool)
    for p in range(P):
        scored[p, torch.randperm(G, generator=gen)[:n]] = True
    scored = scored.reshape(-1)
    lengths = torch.randint(1, 9, (P * G,), generator=gen).float()
    fn = ADVANTAGES.get(name)
    masked = fn(rewards, G, scored=scored, **_params(name, lengths))
    alone = fn(rewards[scored], n, **_params(name, lengths[scored]))
    torch.testing.assert_close(masked[scored], alone, rtol=1e-5, atol=1e-6)
    assert torch.equal(masked[~scored], torch.zeros(P * (G - n)))


@pytest.mark.parametrize("name", BUILT_IN)
def test_groups_with_fewer_than_two_scored_get_zero_and_all_scored_changes_nothing(name):
    gen = torch.Generator().manual_seed(3)
    G = 4
    rewards = torch.tensor([1.0, 0.0, 2.0, 0.5] * 4)
    lengths = torch.randint(1, 9, (16,), generator=gen).float()
    scored = torch.tensor([True] * 4 + [False, True, False, False] + [False] * 4 + [True, False, True, True])
    out = ADVANTAGES.get(name)(rewards, G, scored=scored, **_params(name, lengths))
    assert torch.equal(out[4:12], torch.zeros(8))  # one scored sample, none scored: 0 throughout
    assert out[12:].abs().sum() > 0 and out[13] == 0  # the group with 3 scored learns, its unscored row not
    everyone = torch.ones(16, dtype=torch.bool)
    full = ADVANTAGES.get(name)(rewards, G, scored=everyone, **_params(name, lengths))
    torch.testing.assert_close(full, ADVANTAGES.get(name)(rewards, G, **_params(name, lengths)), rtol=1e-6, atol=1e-6)


def test_gdpo_leaves_unscored_rows_out_of_each_reward_and_of_the_batch_whitening():
    gen = torch.Generator().manual_seed(11)
    P, G, n = 4, 4, 2
    rewards = torch.randint(0, 3, (P * G, 2), generator=gen).float()
    scored = torch.tensor([True, False, True, False] * P)
    fn = REWARD_AGGREGATIONS.get("normalize_then_sum")
    masked = fn(rewards, [1.0, 0.5], G, "grpo", scored=scored)
    alone = fn(rewards[scored], [1.0, 0.5], n, "grpo")
    torch.testing.assert_close(masked[scored], alone, rtol=1e-5, atol=1e-6)
    assert torch.equal(masked[~scored], torch.zeros(P * (G - n)))


def test_an_estimator_without_takes_scored_is_refused_naming_the_setting():
    def plain(rewards, group_size):
        return rewards - rewards.mean()

    match = r"'plain_test' cannot leave out .* model.algorithm.unscored: zero"
    with pytest.MonkeyPatch.context() as patch, pytest.raises(ValueError, match=match):
        patch.setattr(ADVANTAGES, "variant", lambda name: Variant(name, plain, AdvantageSpec()))
        REWARD_AGGREGATIONS.get("sum_then_normalize")(
            torch.ones(4, 1), [1.0], 4, "plain_test", scored=torch.tensor([True, False, True, True])
        )


def test_gfpo_cuts_the_scored_mask_to_the_kept_rows():
    from lightning_grpo.core.shaping import gfpo_advantages

    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 0.5, 0.0, 1.0])  # G' = 4, keep 3 of each
    keep = torch.tensor([True, True, True, False, True, False, True, True])
    scored = torch.tensor([True, False, True, True, True, True, True, False])
    out = gfpo_advantages(rewards, keep, 4, "grpo", scored=scored)
    expected = torch.zeros(8)
    expected[keep] = ADVANTAGES.get("grpo")(rewards[keep], 3, scored=scored[keep])
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert out[1] == 0 and out[7] == 0 and out[0] == -out[2] != 0  # kept group 0: [1, None, 0] -> +-1/sqrt(2)
