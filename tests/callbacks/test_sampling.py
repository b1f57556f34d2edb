"""sample_groups: dynamic sampling keeps groups by the spread of the total reward or of one
chosen reward function (verl filter_groups.metric), and refills from later rounds."""

from __future__ import annotations

import pytest
import torch

from lightning_grpo.callbacks.sampling import GroupSelector, sample_groups
from lightning_grpo.data.reward_set import RewardSet, RewardSpec
from lightning_grpo.rollout.base import Rollout, RolloutEngine, SamplingConfig

G = 4


class ScriptedEngine(RolloutEngine):
    """Completion i of prompt p is the token list [5 + (p * i) % 3]: prompt 0 repeats one answer,
    the others vary. The prompt id is the prompt's only token."""

    needs_weight_sync = False

    def generate(self, prompt_ids, sampling, seed):
        completions = [[5 + (p[0] * i) % 3, 1] for p in prompt_ids for i in range(sampling.n)]
        return Rollout(
            [list(p) for p in prompt_ids],
            completions,
            [[-1.0, -1.0]] * len(completions),
            [True] * len(completions),
            group_size=sampling.n,
        )

    def load_weights(self, weights, version=None):
        pass


def accuracy(completions, completion_ids, **_):
    return [float(ids[0] == 5) for ids in completion_ids]  # varies unless the group repeats one answer


def penalty(completions, completion_ids, **_):
    return [-0.01 * i for i in range(len(completions))]  # varies in every group


def _run(tiny_model_path, signal_column, rounds=1):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    rewards = RewardSet([RewardSpec(accuracy), RewardSpec(penalty)])
    selector = GroupSelector(group_size=G, dynamic_sampling=True, signal_column=signal_column)
    prompts = {0: [0, 1, 2], 1: [3, 4, 6]}  # round -> prompt ids (0 and 3, 6 repeat one answer)
    return sample_groups(
        ScriptedEngine(),
        rewards,
        tokenizer,
        SamplingConfig(n=G, max_new_tokens=2),
        selector,
        lambda r: [{"prompt_ids": [p]} for p in prompts[r]],
        lambda r: r,
        target_groups=3,
        max_rounds=rounds,
    )


def test_filter_on_the_total_keeps_groups_that_differ_only_by_the_penalty(tiny_model_path):
    result = _run(tiny_model_path, signal_column=None)
    assert result.metrics["kept_groups"] == 3.0 and result.metrics["generation_rounds"] == 1.0


def test_filter_on_accuracy_drops_them_and_refills(tiny_model_path):
    result = _run(tiny_model_path, signal_column=0, rounds=2)
    # round 0 keeps prompts 1, 2 (prompt 0's accuracy is constant); round 1 adds prompt 4
    prompts = result.tensors.input_ids[::G, -3].tolist()  # the prompt token before the completion
    assert prompts == [1, 2, 4]
    assert result.metrics["kept_groups"] == 3.0 and result.metrics["generation_rounds"] == 2.0
    acc = result.rewards[:, 0].view(-1, G)  # [P, G]
    assert bool((acc.max(-1).values > acc.min(-1).values).all())


def test_dynamic_sampling_reward_must_name_a_configured_reward():
    from lightning_grpo import RolloutCallback, SelectionSettings

    with pytest.raises(
        ValueError,
        match=r"rollout.selection.dynamic_sampling_reward 'acc' is not one of the configured rewards \['prefix_match'\]",
    ):
        RolloutCallback(
            engine="hf",
            rewards=[RewardSpec("prefix_match")],
            selection=SelectionSettings(dynamic_sampling=True, dynamic_sampling_reward="acc"),
        )


def test_wrong_completion_length_is_the_mean_over_unrewarded_samples():
    from lightning_grpo.callbacks.sampling import rollout_statistics
    from lightning_grpo.data.reward_set import RewardScores

    ids = [[5, 1], [5, 6, 7, 1], [5, 6, 7, 8, 9, 1], [6]]  # lengths 2, 4, 6, 1
    rollout = Rollout([[3]], ids, [[-1.0] * len(c) for c in ids], [True, True, True, False], group_size=4)

    def stats(rewards):
        scores = RewardScores(torch.tensor(rewards).view(4, 1), torch.tensor([1.0]), ["acc"], [False])
        return rollout_statistics(rollout, scores)

    assert stats([1.0, 0.0, 0.0, 1.0])["completion_length_wrong_mean"] == pytest.approx(5.0)  # (4 + 6) / 2
    assert stats([0.0, 0.0, 0.0, 0.0])["completion_length_wrong_mean"] == pytest.approx(13 / 4)
    assert stats([1.0, 1.0, 1.0, 1.0]).get("completion_length_wrong_mean") is None  # none wrong: absent
