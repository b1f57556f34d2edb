"""ZeroRewardGuard: every reward 0 in the run's first generation batches. By hand on made-up statistics, the
default set, the measured runs (quiet), and a short run whose integer answers meet a reward that compares text."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from lightning_grpo import RolloutCallback, SamplingConfig, ZeroRewardGuard
from lightning_grpo.callbacks.guard_set import default_guards
from lightning_grpo.callbacks.zero_reward import ZERO_REWARD_BATCHES, all_rewards_zero
from tests.helpers.guards import drive

ZERO = {"reward_mean": 0.0, "reward_std": 0.0, "reward_min": 0.0, "reward_max": 0.0}
ZERO |= {"reward/exact/mean": 0.0, "reward/exact/std": 0.0, "truncation_ratio": 0.25}
PAID = ZERO | {"reward_mean": 0.125, "reward_max": 1.0, "reward/exact/mean": 0.125}
HEADLESS = {"truncation_ratio": 0.0}  # no reward statistics (not a rollout batch of rewards): not counted


def test_fires_once_at_the_nth_zero_batch_naming_the_causes(caplog):
    guard = ZeroRewardGuard(steps=3)
    rollout = RolloutCallback(engine="hf", sampling=SamplingConfig(n=4, max_new_tokens=7), rewards=["exact_match"])
    with caplog.at_level(logging.WARNING, logger="lightning_grpo.guards"):
        fired = drive(guard, [ZERO, HEADLESS, ZERO, ZERO, ZERO, ZERO], callbacks=[rollout])
    assert fired == [3]  # the third zero batch (step 1 had no rewards); once for the run
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning == (
        "[zero_reward] step 3: every reward was 0 in the first 3 generation batches (all samples, all reward "
        "functions): nothing is learned. Likeliest causes: (1) the answer's type: answers reach the rewards as text "
        "(data.format.answer_column: answer), a reward comparing numbers never matches; (2) the reward function or "
        "its column: 'exact_match' is not the one meant, or reads another column; (3) the completions never write "
        "the answer in the format the reward extracts (see completions.jsonl); (4) truncation: 25% of completions "
        "hit max_new_tokens=7 (raise rollout.sampling.max_new_tokens). Score a right completion by hand to tell which"
    )


def test_a_batch_that_pays_ends_the_watch_and_nothing_cut_off_drops_truncation():
    assert drive(ZeroRewardGuard(steps=2), [ZERO, PAID, ZERO, ZERO, ZERO]) == []  # only the run's first batches
    guard = ZeroRewardGuard(steps=1)
    drive(guard, [ZERO | {"truncation_ratio": 0.0}])
    message = guard.alarms[0]["message"]
    assert message.startswith("every reward was 0 in the first 1 generation batch (all samples")
    assert "(3) the completions never write" in message and "truncation" not in message
    assert "(2) the reward function or its column: 'exact' is not" in message  # no rollout callback: from the metrics


def test_all_rewards_zero_reads_the_total_and_every_function():
    assert all_rewards_zero(ZERO)
    assert not all_rewards_zero(ZERO | {"reward/format/mean": 0.0, "reward/format/std": 0.5})  # -1 and +1: mean 0
    assert not all_rewards_zero(PAID)
    assert not all_rewards_zero(HEADLESS)


def test_the_watch_survives_a_resume():
    guard = ZeroRewardGuard(steps=3)
    drive(guard, [ZERO, ZERO])
    resumed = ZeroRewardGuard(steps=3)
    resumed.load_state_dict(guard.state_dict())
    assert drive(resumed, [ZERO, ZERO], first_step=2) == [2]
    done = ZeroRewardGuard(steps=1)
    done.load_state_dict({"zero_batches": 0, "done": True})  # the run paid before the checkpoint
    assert drive(done, [ZERO]) == []


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: ZeroRewardGuard(steps=0), r"ZeroRewardGuard.steps must be an integer >= 1, got 0"),
        (lambda: ZeroRewardGuard(action="fix"), r"ZeroRewardGuard.action must be one of warn, skip, stop; got 'fix'"),
    ],
)
def test_settings_are_checked(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_the_default_set_holds_it_before_the_signal_guards():
    names = [type(g).__name__ for g in default_guards()]
    (guard,) = [g for g in default_guards() if isinstance(g, ZeroRewardGuard)]
    assert (guard.steps, guard.action, ZERO_REWARD_BATCHES) == (10, "warn", 10)
    assert names.index("ZeroRewardGuard") < names.index("ZeroStdGuard") < names.index("TruncationGuard")


def test_quiet_on_the_measured_quickstart_and_tool_runs():
    """tests/fixtures/guard_series_heldout.json: every run paid something within its first batches."""
    runs = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "guard_series_heldout.json").read_text())
    quiet = {
        name: drive(ZeroRewardGuard(), [{"reward_mean": r} for r in run["reward_mean"]]) for name, run in runs.items()
    }
    assert quiet == {name: [] for name in runs}


def test_integer_answers_reach_a_text_reward_as_text_in_a_short_run(tmp_path, caplog, monkeypatch):
    """The issue's run: a JSONL whose answers are JSON integers and a reward that compares text. The answers
    reach the reward as text, so it pays and no guard fires; a reward that compares with numbers never pays,
    and ZeroRewardGuard says so at step 9 (the 10th generation batch)."""
    from tests.helpers.runs import train_recipe

    rows = [{"prompt": f"{i:04d}=", "answer": (i % 10 + 1) % 10} for i in range(1000, 1064)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "int_answer_rewards.py").write_text(
        "def text(completions, answer, **_):\n    return [float(c[:1] == a) for c, a in zip(completions, answer)]\n"
        "def number(completions, answer, **_):\n    return [float(c[:1] == int(a)) for c, a in zip(completions, answer)]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    extra = ["--data.source=null", f"--data.train_files={tmp_path / 'train.jsonl'}"]
    with caplog.at_level(logging.WARNING, logger="lightning_grpo.guards"):
        text, _ = train_recipe(
            tmp_path / "a", "quickstart.yaml", 10, extra=[*extra, "--rollout.rewards=int_answer_rewards.text"]
        )
        number, _ = train_recipe(
            tmp_path / "b", "quickstart.yaml", 10, extra=[*extra, "--rollout.rewards=int_answer_rewards.number"]
        )
    assert text.datamodule.train_records[0]["answer"] == "1"
    guards = [[c for c in run.trainer.callbacks if isinstance(c, ZeroRewardGuard)] for run in (text, number)]
    assert [[a["step"] for a in guard.alarms] for (guard,) in guards] == [[], [9]]  # attached by default
    (warning,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[zero_reward]")]
    assert warning.startswith("[zero_reward] step 9: every reward was 0 in the first 10 generation batches")
    assert "(data.format.answer_column: answer, the first '1')" in warning
    assert "of completions hit max_new_tokens=2 (raise rollout.sampling.max_new_tokens)" in warning
