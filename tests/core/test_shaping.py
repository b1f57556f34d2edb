"""Soft overlong punishment, dynamic sampling and GFPO selection/advantages."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_grpo.core.advantages import grpo_advantages
from lightning_grpo.core.registry import ADVANTAGES, SELECTIONS
from lightning_grpo.core.shaping import (
    dynamic_sampling_filter,
    gfpo_advantages,
    gfpo_length_selection,
    gfpo_reward_per_token_selection,
    soft_overlong_punishment,
)
from tests.core import EPS, close, t


def b(values):
    return torch.tensor(values, dtype=torch.bool)


def test_registered_names():
    assert set(SELECTIONS.names()) >= {"dynamic_sampling", "gfpo_length", "gfpo_reward_per_token"}
    assert SELECTIONS.get("gfpo_length") is gfpo_length_selection


# ----------------------------------------------------------------------------------------------
# overlong
# ----------------------------------------------------------------------------------------------
def test_soft_overlong_boundaries():
    # L_max = 20, L_cache = 4 -> free up to 16; band (16 - L) / 4 for 16 < L <= 20; -1 beyond
    lengths = torch.tensor([0, 15, 16, 17, 18, 19, 20, 21, 100])
    expected = [0.0, 0.0, 0.0, (16 - 17) / 4, (16 - 18) / 4, (16 - 19) / 4, (16 - 20) / 4, -1.0, -1.0]
    close(soft_overlong_punishment(lengths, 20, 4), expected)


def test_soft_overlong_dapo_values():
    # DAPO: L_max = 20480, L_cache = 4096 -> expected length 16384
    lengths = torch.tensor([16384, 16385, 18432, 20480, 20481])
    expected = [0.0, -1 / 4096, -2048 / 4096, -1.0, -1.0]
    close(soft_overlong_punishment(lengths, 20480, 4096), expected)


def test_soft_overlong_loop_reference():
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(0, 40, (200,), generator=gen)
    max_len, cache = 30, 7

    def ref(n):
        if n <= max_len - cache:
            return 0.0
        if n <= max_len:
            return ((max_len - cache) - n) / cache
        return -1.0

    close(soft_overlong_punishment(lengths, max_len, cache), [ref(n) for n in lengths.tolist()])


def test_soft_overlong_edges():
    # cache = max: the band starts at 0; cache = 0: hard punishment only beyond max
    close(soft_overlong_punishment(torch.tensor([0, 5, 10, 11]), 10, 10), [0.0, -0.5, -1.0, -1.0])
    close(soft_overlong_punishment(torch.tensor([0, 10, 11]), 10, 0), [0.0, 0.0, -1.0])
    close(soft_overlong_punishment(torch.tensor([17.0], dtype=torch.bfloat16), 20, 4), [-0.25])
    with pytest.raises(ValueError, match="cache_length"):
        soft_overlong_punishment(torch.tensor([1]), 10, 11)
    with pytest.raises(ValueError, match="cache_length"):
        soft_overlong_punishment(torch.tensor([1]), 10, -1)
    with pytest.raises(ValueError, match="max_length"):
        soft_overlong_punishment(torch.tensor([1]), 0, 0)


# ----------------------------------------------------------------------------------------------
# dynamic sampling
# ----------------------------------------------------------------------------------------------
def test_dynamic_sampling_hand():
    r = t([1, 1, 1, 1, 0, 1, 0, 0, 0.5, 0.5, 0.5, 0.5])
    out = SELECTIONS.get("dynamic_sampling")(r, 4)
    assert out.dtype == torch.bool and out.tolist() == [False, True, False]
    # atol: [1, 1.05] has spread .05 <= .1 -> dropped; [0, 1] kept
    assert dynamic_sampling_filter(t([1.0, 1.05, 0.0, 1.0]), 2, atol=0.1).tolist() == [False, True]
    # G = 1: never kept; bf16 input
    assert dynamic_sampling_filter(t([1.0, 0.0]), 1).tolist() == [False, False]
    assert dynamic_sampling_filter(t([0, 1, 1, 1]).to(torch.bfloat16), 2).tolist() == [True, False]
    with pytest.raises(ValueError, match=r"B=3.*group_size=2"):
        dynamic_sampling_filter(t([0, 1, 1]), 2)


def test_dynamic_sampling_loop_reference():
    gen = torch.Generator().manual_seed(1)
    r = torch.randint(0, 2, (64 * 4,), generator=gen).float()
    expected = [len(set(r[i : i + 4].tolist())) > 1 for i in range(0, r.numel(), 4)]
    assert dynamic_sampling_filter(r, 4).tolist() == expected


# ----------------------------------------------------------------------------------------------
# GFPO selection
# ----------------------------------------------------------------------------------------------
def test_gfpo_length_ties():
    # group 0 lengths [5,3,3,7]: the two 3s (rows 1, 2); group 1 all 2: first two rows;
    # group 2 [4,2,4,4]: row 1 (2), then the tie at 4 goes to the lowest index, row 0
    lengths = torch.tensor([5, 3, 3, 7, 2, 2, 2, 2, 4, 2, 4, 4])
    rewards = torch.zeros(12)
    keep = SELECTIONS.get("gfpo_length")(rewards, lengths, 4, 2)
    assert keep.dtype == torch.bool
    assert keep.tolist() == [False, True, True, False, True, True, False, False, True, True, False, False]


def test_gfpo_reward_per_token_ties():
    # group 0 r/len = [1/10, 1/5, 0/1, 2/20] = [.1, .2, 0, .1]: row 1, then the .1 tie -> row 0
    # group 1 r/len = [-1/2, -1/4, 0/0 -> 0/1 = 0, 3/1]: k = 2 -> rows 3 (3.0), 2 (0.0)
    rewards = t([1, 1, 0, 2, -1, -1, 0, 3])
    lengths = torch.tensor([10, 5, 1, 20, 2, 4, 0, 1])
    keep = SELECTIONS.get("gfpo_reward_per_token")(rewards, lengths, 4, 2)
    assert keep.tolist() == [True, True, False, False, False, False, True, True]
    # k = G' keeps everything; k = 1 the single best
    assert gfpo_reward_per_token_selection(rewards, lengths, 4, 4).all()
    assert gfpo_reward_per_token_selection(rewards, lengths, 4, 1).tolist() == [
        False,
        True,
        False,
        False,
        False,
        False,
        False,
        True,
    ]


def test_gfpo_selection_validation():
    with pytest.raises(ValueError, match="k must be"):
        gfpo_length_selection(torch.zeros(4), torch.ones(4), 4, 0)
    with pytest.raises(ValueError, match="k must be"):
        gfpo_length_selection(torch.zeros(4), torch.ones(4), 4, 5)
    with pytest.raises(ValueError, match="must match"):
        gfpo_reward_per_token_selection(torch.zeros(4), torch.ones(3), 4, 2)
    with pytest.raises(ValueError, match=r"B=6.*group_size=4"):
        gfpo_length_selection(torch.zeros(6), torch.ones(6), 4, 2)


def _ref_select(keys, g, k):
    """Loop reference: per group, indices ordered by (key, index); first k kept."""
    keep = [False] * len(keys)
    for start in range(0, len(keys), g):
        order = sorted(range(start, start + g), key=lambda i: (keys[i], i))
        for i in order[:k]:
            keep[i] = True
    return keep


@pytest.mark.parametrize("g,k", [(4, 1), (6, 3), (8, 8), (16, 8)])
def test_gfpo_selection_loop_reference(g, k):
    gen = torch.Generator().manual_seed(g * 100 + k)
    lengths = torch.randint(1, 6, (5 * g,), generator=gen)  # many ties on purpose
    rewards = torch.randint(0, 3, (5 * g,), generator=gen).float()
    assert gfpo_length_selection(rewards, lengths, g, k).tolist() == _ref_select(lengths.tolist(), g, k)
    ratios = [-(r / n) for r, n in zip(rewards.tolist(), lengths.tolist())]
    assert gfpo_reward_per_token_selection(rewards, lengths, g, k).tolist() == _ref_select(ratios, g, k)


# ----------------------------------------------------------------------------------------------
# GFPO advantages
# ----------------------------------------------------------------------------------------------
def test_gfpo_advantages_hand():
    # group 0 keeps [1, 0, .5] (rows 0, 1, 3): mean .5, Bessel var (.25 + .25 + 0) / 2 = .25,
    #   std .5 -> [.5/.5, -.5/.5, -, 0]; row 2 dropped -> 0
    # group 1 keeps rows 4, 6, 7 = [2, 2, 2]: all equal -> 0
    rewards = t([1, 0, 1, 0.5, 2, 9, 2, 2])
    keep = b([True, True, False, True, True, False, True, True])
    a = 0.5 / (0.5 + EPS)
    close(gfpo_advantages(rewards, keep, 4), [a, -a, 0, 0, 0, 0, 0, 0])
    # another estimator by name: dr_grpo over the kept set
    close(gfpo_advantages(rewards, keep, 4, estimator="dr_grpo"), [0.5, -0.5, 0, 0, 0, 0, 0, 0])
    close(gfpo_advantages(rewards, keep, 4, estimator="grpo", eps=0.5), [0.5, -0.5, 0, 0, 0, 0, 0, 0])


def test_gfpo_advantages_loop_reference():
    gen = torch.Generator().manual_seed(3)
    g, k = 8, 3
    rewards = torch.rand(6 * g, generator=gen)
    lengths = torch.randint(1, 50, (6 * g,), generator=gen)
    keep = gfpo_length_selection(rewards, lengths, g, k)
    expected = [0.0] * rewards.numel()
    for start in range(0, rewards.numel(), g):
        idx = [i for i in range(start, start + g) if keep[i]]
        vals = [rewards[i].item() for i in idx]
        m = sum(vals) / k
        s = math.sqrt(sum((v - m) ** 2 for v in vals) / (k - 1))
        for i, v in zip(idx, vals):
            expected[i] = (v - m) / (s + EPS)
    close(gfpo_advantages(rewards, keep, g), expected)
    # k = G' equals the plain estimator
    for name in ADVANTAGES.names():
        params = {"lengths": lengths.float()} if ADVANTAGES.spec(name).needs_lengths else {}
        close(
            gfpo_advantages(rewards, torch.ones(6 * g, dtype=torch.bool), g, name, **params),
            ADVANTAGES.get(name)(rewards, g, **params),
        )
    # a per-row parameter is cut to the kept rows
    opo = gfpo_advantages(rewards, keep, g, "opo", lengths=lengths.float())
    close(opo[keep], ADVANTAGES.get("opo")(rewards[keep], k, lengths=lengths[keep].float()))


def test_gfpo_advantages_edges():
    # k = 1: a kept group of one -> 0, no nan, for an estimator without the group std; bf16 rewards
    rewards = t([1, 0, 0, 1]).to(torch.bfloat16)
    out = gfpo_advantages(rewards, b([False, True, True, False]), 2, estimator="dr_grpo")
    close(out, [0.0, 0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match=r"advantage 'grpo' divides by the std .* got group_size=1"):
        gfpo_advantages(rewards, b([False, True, True, False]), 2)
    out = gfpo_advantages(rewards, b([True, True, True, True]), 4)
    close(out, grpo_advantages(t([1, 0, 0, 1]), 4))
    # empty batch
    assert gfpo_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.bool), 4).shape == (0,)
    with pytest.raises(ValueError, match="same number"):
        gfpo_advantages(t([1, 0, 0, 1]), b([True, True, True, False]), 2)
    with pytest.raises(ValueError, match="same number"):
        gfpo_advantages(t([1, 0, 0, 1]), b([False, False, False, False]), 2)
    with pytest.raises(ValueError, match="must match"):
        gfpo_advantages(t([1, 0, 0, 1]), b([True, True]), 2)
