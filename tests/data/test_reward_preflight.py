"""Rewards as TRL users write them: every reward function is called on stand-in
completions of real training rows before any engine starts (one error naming the function and
what was wrong); ``None`` means "not applicable" (left out of the function's mean and of the
weighted sum, as TRL does); the chat or text convention is read from the data."""

from __future__ import annotations

import sys
import warnings
from unittest import mock

import pytest
import torch

from lightning_grpo.data.records import RAW_PROMPT
from lightning_grpo.data.reward_set import RewardSet, RewardSpec
from tests.helpers.bad_input import write_config

pytestmark = pytest.mark.usefixtures("tiny_cache")


# ------------------------------------------------------------------ reward functions under test
def raises(completions, **_):
    raise KeyError("solution")


def wrong_length(completions, **_):
    return [1.0]


def a_string(completions, **_):
    return "1.0"


def no_arguments():
    return []


def first_words(completions, **_):
    """TRL-style for chat data: each completion is a list of messages."""
    return [float(c[0]["content"].startswith("4")) for c in completions]


def half_applicable(completions, **_):
    return [1.0, None, 0.5, None]


def ones(completions, **_):
    return [1.0] * len(completions)


def none_at_3(completions, **_):
    return [2.0, 2.0, 2.0, None]


# ------------------------------------------------------------------- probed before the engine
@pytest.mark.parametrize(
    ("fn", "message"),
    [
        ("raises", "reward function 'raises' raised KeyError: 'solution' on sample 0 (completion '2')"),
        ("wrong_length", "reward function 'wrong_length' returned the wrong number of scores: expected 4, got 1"),
        ("a_string", "reward function 'a_string' returned a str; expected a list of 4 numbers"),
        (
            "no_arguments",
            "reward function 'no_arguments' raised TypeError: no_arguments() takes 0 positional arguments but 1 was given",
        ),
    ],
    ids=["raises", "wrong_length", "a_string", "arity"],
)
def test_a_bad_reward_fails_before_the_engine_starts(tmp_path, capsys, fn, message):
    from lightning_grpo.cli import main

    path = write_config(tmp_path, **{"rollout.rewards": [{"name": f"tests.data.test_reward_preflight.{fn}"}]})
    with (
        mock.patch.object(sys, "argv", ["lightning-grpo"]),
        mock.patch("lightning_grpo.callbacks.rollout.RolloutCallback.ensure_engine") as build,
        pytest.raises(SystemExit) as exit_,
    ):
        main(["fit", "-c", str(path)])
    assert exit_.value.code == 2 and not build.called
    lines = capsys.readouterr().err.rstrip("\n").splitlines()
    assert lines[-1].startswith(f"lightning-grpo: error: rollout.rewards: {message}"), lines[-1]
    assert lines[-1].endswith("(called before training on 4 stand-in completions of 2 training rows)"), lines[-1]
    assert not (tmp_path / "logs").exists()


# ------------------------------------------------------------------------- None: not applicable
def test_none_is_left_out_of_its_mean_and_of_the_weighted_sum():
    rewards = RewardSet([RewardSpec(half_applicable, weight=1.0), RewardSpec(ones, weight=2.0)])
    scores = rewards.score(["a", "b", "c", "d"])
    assert torch.equal(scores.applicable, torch.tensor([[True, True], [False, True], [True, True], [False, True]]))
    assert torch.allclose(scores.rewards @ scores.weights, torch.tensor([3.0, 2.0, 2.5, 2.0]))  # TRL's nansum
    metrics = scores.metrics()
    assert metrics["reward/half_applicable/mean"] == pytest.approx(0.75)  # mean of 1.0 and 0.5 (TRL's nanmean)
    assert metrics["reward/half_applicable/std"] == pytest.approx(0.25)
    assert metrics["reward/half_applicable/applicable"] == pytest.approx(0.5)
    assert metrics["reward/ones/mean"] == 1.0 and "reward/ones/applicable" not in metrics


def test_a_sample_no_function_scores_gets_zero_and_a_warning():
    rewards = RewardSet([RewardSpec(half_applicable), RewardSpec(none_at_3, weight=0.5)])
    with pytest.warns(
        UserWarning,
        match=r"every reward function returned None for sample 3 \(completion 'd'\): it is left out of its group",
    ):
        scores = rewards.score(["a", "b", "c", "d"])
    assert torch.allclose(scores.rewards @ scores.weights, torch.tensor([2.0, 1.0, 1.5, 0.0]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        RewardSet([RewardSpec(half_applicable), RewardSpec(ones)]).score(
            ["a", "b", "c", "d"]
        )  # every sample scored: quiet


# ------------------------------------------------------------------- the convention from the data
def _columns(prompts):
    return {RAW_PROMPT: prompts, "answer": ["4"] * len(prompts)}


def test_chat_data_gets_chat_completions_without_a_convention_flag():
    chat = [[{"role": "user", "content": "2+2?"}]] * 4
    scores = RewardSet([RewardSpec(first_words)]).score(["4", "5", "42", "x"], _columns(chat))
    assert scores.rewards[:, 0].tolist() == [1.0, 0.0, 1.0, 0.0]


def test_text_data_and_the_override_keep_plain_completions():
    def text_only(completions, **_):
        assert all(isinstance(c, str) for c in completions)
        return [float(c == "4") for c in completions]

    chat = [[{"role": "user", "content": "2+2?"}]] * 2
    assert RewardSet([RewardSpec(text_only)]).score(["4", "5"], _columns(["2+2?", "2+2?"])).rewards[:, 0].tolist() == [
        1.0,
        0.0,
    ]
    overridden = RewardSet([RewardSpec(text_only, convention="columns")])
    assert overridden.score(["4", "5"], _columns(chat)).rewards[:, 0].tolist() == [1.0, 0.0]
    builtin = RewardSet([RewardSpec("exact_match")])  # the package's own rewards read text, whatever the data
    assert builtin.score(["4", "5"], _columns(chat)).rewards[:, 0].tolist() == [1.0, 0.0]
