"""TruncationGuard: most completions cut off by ``max_new_tokens`` with no signal among them, several
generation batches in a row. By hand on made-up statistics, the statistics it reads, the default set,
and a short run on the tiny model whose answers do not fit the budget."""

from __future__ import annotations

import logging

import pytest
import torch

from lightning_grpo import RolloutCallback, SamplingConfig, TruncationGuard
from lightning_grpo.callbacks.guard_set import default_guards
from lightning_grpo.callbacks.sampling import rollout_statistics
from lightning_grpo.data.reward_set import RewardScores
from lightning_grpo.rollout.base import Rollout
from tests.helpers.guards import drive

CUT = {"truncation_ratio": 0.9, "truncated_reward_mean": 0.0, "truncated_reward_std": 0.0, "reward_mean": 0.02}
HALF = CUT | {"truncation_ratio": 0.5}  # not more than the threshold 0.5
PAID = CUT | {"truncation_ratio": 1.0, "truncated_reward_std": 0.3}  # the quickstart: cut-off answers earn
LEARNED = CUT | {"truncation_ratio": 1.0, "truncated_reward_mean": 1.0, "reward_mean": 1.0}  # all cut off, all right


def test_fires_after_steps_batches_in_a_row_warns_once_and_restarts_after_a_batch_below(caplog):
    guard = TruncationGuard(threshold=0.5, steps=3)
    with caplog.at_level(logging.WARNING, logger="lightning_grpo.guards"):
        fired = drive(guard, [CUT, CUT, CUT, CUT, HALF, CUT, CUT, CUT])
    assert fired == [2, 3, 7]  # not at 0-1; the streak restarts at step 4, so 5-6 are quiet again
    (warning,) = [r.getMessage() for r in caplog.records]  # one warning for the whole run
    assert warning == (
        "[truncation] step 2: 90% of completions hit the length limit (3 generation batches in a row above 50%) and "
        "the cut-off ones all scored 0: they carry no learning signal. Give the answers room "
        "(raise rollout.sampling.max_new_tokens), or take cut-off completions out of the signal: "
        "rollout.selection.overlong_filter: true (DAPO's overlong filter) or the soft_overlong reward (DAPO's soft "
        "overlong punishment)"
    )
    assert guard.streak == 3


def test_paid_or_learned_cut_off_completions_do_not_count():
    """Cut-off completions that earn different rewards carry signal (the quickstart); all cut off and all
    right is a learned task when ``max_reward`` is set; a batch with nothing cut off has no spread to read."""
    assert drive(TruncationGuard(steps=2), [CUT, PAID] * 4) == []
    assert drive(TruncationGuard(steps=2, max_reward=0.9), [CUT, LEARNED] * 4) == []
    assert drive(TruncationGuard(steps=2), [CUT, LEARNED]) == [1]  # no max_reward: it counts
    none_cut = {"truncation_ratio": 0.0, "reward_mean": 0.0}
    assert drive(TruncationGuard(steps=1, threshold=0.1), [none_cut] * 3) == []


def test_the_message_names_the_budget_and_its_option():
    rollout = RolloutCallback(engine="hf", sampling=SamplingConfig(n=4, max_new_tokens=7))
    guard = TruncationGuard(steps=1)
    drive(guard, [CUT], callbacks=[rollout])
    message = guard.alarms[0]["message"]
    assert message.startswith("90% of completions hit max_new_tokens=7 (1 generation batches in a row above 50%)")
    assert "(raise rollout.sampling.max_new_tokens, now 7)" in message


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: TruncationGuard(threshold=0), r"TruncationGuard.threshold must be in \(0, 1\], got 0"),
        (lambda: TruncationGuard(steps=0), r"TruncationGuard.steps must be an integer >= 1, got 0"),
        (lambda: TruncationGuard(action="fix"), r"TruncationGuard.action must be one of warn, skip, stop; got 'fix'"),
    ],
)
def test_settings_are_checked(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_the_streak_survives_a_checkpoint():
    guard = TruncationGuard(steps=3)
    drive(guard, [CUT, CUT])
    resumed = TruncationGuard(steps=3)
    resumed.load_state_dict(guard.state_dict())
    assert drive(resumed, [CUT], first_step=2) == [2]


def test_the_default_set_holds_it_with_max_reward():
    (guard,) = [g for g in default_guards() if isinstance(g, TruncationGuard)]
    assert (guard.threshold, guard.steps, guard.max_reward, guard.action) == (0.5, 10, 0.9, "warn")


def test_rollout_statistics_give_the_reward_of_the_cut_off_completions():
    ids = [[5, 1], [5, 6, 7], [5, 6, 7], [6, 8, 9]]  # rows 1-3 hit a budget of 3 without EOS
    rollout = Rollout([[3]], ids, [[-1.0] * len(c) for c in ids], [True, False, False, False], group_size=4)

    def stats(rewards):
        scores = RewardScores(torch.tensor(rewards).view(4, 1), torch.tensor([1.0]), ["acc"], [False])
        return rollout_statistics(rollout, scores)

    out = stats([1.0, 0.0, 0.5, 1.0])
    assert out["truncation_ratio"] == 0.75
    assert out["truncated_reward_mean"] == pytest.approx(0.5, abs=1e-7)
    assert out["truncated_reward_std"] == pytest.approx((1 / 6) ** 0.5, abs=1e-7)  # population std of 0, 0.5, 1
    assert stats([1.0, 0.0, 0.0, 0.0])["truncated_reward_std"] == 0.0
    finished = Rollout([[3]], ids[:1] * 4, [[-1.0, -1.0]] * 4, [True] * 4, group_size=4)
    scores = RewardScores(torch.zeros(4, 1), torch.tensor([1.0]), ["acc"], [False])
    assert "truncated_reward_std" not in rollout_statistics(finished, scores)  # nothing cut off: absent


def test_a_budget_too_small_for_the_answers_warns_in_a_short_quickstart_run(tmp_path, caplog):
    """The quickstart recipe (default guards) on prompts whose answers take two characters, scored by exact
    match, with room for one: every completion is cut off and scores 0, and the default TruncationGuard
    warns once, at the 10th generation batch (step 9). So does the default ZeroRewardGuard (every reward 0),
    which names the truncation among its causes; no other guard fires."""
    import json

    from lightning_grpo.callbacks.guards import Guard
    from tests.helpers.runs import train_recipe

    rows = [{"prompt": f"{i:04d}=", "answer": f"{i % 100:02d}"} for i in range(1000, 1064)]
    for split in ("train", "val"):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    extra = [
        "--data.source=null",
        f"--data.train_files={tmp_path / 'train.jsonl'}",
        f"--data.val_files={tmp_path / 'val.jsonl'}",
        "--rollout.rewards=[{name: exact_match}]",
        "--rollout.sampling.max_new_tokens=1",
    ]
    with caplog.at_level(logging.WARNING, logger="lightning_grpo.guards"):
        built, _ = train_recipe(tmp_path, "quickstart.yaml", 10, extra=extra)
    (guard,) = [c for c in built.trainer.callbacks if isinstance(c, TruncationGuard)]  # attached by default
    assert [a["step"] for a in guard.alarms] == [9]
    others = [
        (g.name, a["step"])
        for g in built.trainer.callbacks
        if isinstance(g, Guard) and g is not guard
        for a in g.alarms
    ]
    assert others == [("zero_reward", 9)]
    (zero,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[zero_reward]")]
    assert "of completions hit max_new_tokens=1 (raise rollout.sampling.max_new_tokens)" in zero
    (warning,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[truncation]")]
    assert "hit max_new_tokens=1 (10 generation batches in a row above 50%)" in warning
    assert "raise rollout.sampling.max_new_tokens, now 1" in warning and "overlong_filter" in warning


def test_quiet_on_the_measured_quickstart_and_tool_runs_even_if_every_completion_was_cut_off():
    """tests/fixtures/guard_series_heldout.json, every step, taken at the worst case: every completion cut
    off (the quickstart cuts 92-100%), so the cut-off ones share one reward exactly when the batch has one
    reward level. The default guard stays quiet on all nine runs (at most 4 such batches in a row below
    reward 0.9); without ``max_reward`` it fires on quickstart seeds 4 and 7, which sat at reward 1."""
    import json
    from pathlib import Path

    runs = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "guard_series_heldout.json").read_text())

    def series(run):
        return [
            {"truncation_ratio": 1.0, "truncated_reward_std": 0.0 if levels == 1 else 0.5, "reward_mean": reward}
            for reward, levels in zip(run["reward_mean"], run["reward_levels"])
        ]

    (default,) = [g for g in default_guards() if isinstance(g, TruncationGuard)]
    settings = {key: getattr(default, key) for key in TruncationGuard.SETTINGS}  # threshold, steps, max_reward
    quiet = {name: drive(TruncationGuard(**settings), series(run)) for name, run in runs.items()}
    assert quiet == {name: [] for name in runs}
    fired = {name for name, run in runs.items() if drive(TruncationGuard(), series(run))}
    assert fired == {"quickstart_seed4", "quickstart_seed7"}
