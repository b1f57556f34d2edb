"""RewardDropGuard: a learned behaviour lost. By hand on a short series, and on measured reward
series (tests/fixtures/reward_series.json, benchmarks/reward_series.py): the tool quickstart run
that lost its tool call at step 620 trips it ten steps later until the call is relearned; runs
that learned and kept what they learned never do."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from lightning_grpo import RewardDropGuard
from tests.helpers.guards import drive

SERIES = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "reward_series.json").read_text())


def _drive(guard, rewards, first_step=0, key="reward_mean"):
    """Feed the guard one generation batch's mean reward per entry; the steps it fired at."""
    return drive(guard, [{key: r} for r in rewards], first_step=first_step)


def test_fires_once_half_the_gain_is_gone_by_hand(caplog):
    # window 2: means 0.1 (start) 0.3 0.75 1.0 (best, step 4) 0.8 0.5 0.3 0.6 1.0
    # threshold at best 1.0: 1.0 - 0.5 * (1.0 - 0.1) = 0.55 -> fires at steps 6 (0.5) and 7 (0.3)
    guard = RewardDropGuard(window=2, drop=0.5, min_gain=0.1)
    with caplog.at_level(logging.WARNING, logger="lightning_grpo.guards"):
        steps = _drive(guard, [0.1, 0.1, 0.5, 1.0, 1.0, 0.6, 0.4, 0.2, 1.0, 1.0])
    assert steps == [6, 7]
    assert (guard.start, guard.best, guard.best_step) == (pytest.approx(0.1), pytest.approx(1.0), 4)
    message = guard.alarms[0]["message"]
    assert message.startswith(
        "training reward fell to 0.5 (mean of the last 2 batches) from its best 1 at step 4, "
        "having started at 0.1: 56% of the gain is gone."
    )
    assert len(caplog.records) == 1  # edge-triggered: one warning for steps 6-7


def test_no_alarm_without_a_gain_to_lose():
    """A run that never learned (gain below min_gain) or only fell never fires."""
    assert _drive(RewardDropGuard(window=2, min_gain=0.1), [0.1, 0.15, 0.18, 0.05, 0.0, 0.0]) == []
    assert _drive(RewardDropGuard(window=2, min_gain=0.1), [0.9, 0.8, 0.5, 0.2, 0.1, 0.0]) == []


def test_watches_one_reward_function_when_named():
    guard = RewardDropGuard(window=1, reward="env_reward")
    assert _drive(guard, [0.0, 1.0, 0.2], key="reward/env_reward/mean") == [2]
    assert guard.alarms[0]["message"].startswith("training reward env_reward fell to 0.2")
    assert _drive(RewardDropGuard(window=1, reward="env_reward"), [0.0, 1.0, 0.2]) == []  # the total is not it


def test_the_measured_tool_call_loss_trips_it_until_the_call_is_relearned():
    """Tool quickstart seed 1 (shared-prefix forward): call rate 1.00 -> 0 between steps 619 and 620,
    reward 0.97 -> 0.05; the call comes back at about step 1240. With the defaults (window 20, half
    the gain) the guard fires at every step from 630 to 1335 and at no other: not before the loss,
    not once the reward has come back."""
    rewards = SERIES["tool_quickstart_seed1"]["reward_mean"]
    assert rewards[619] > 0.9 and rewards[620] < 0.1  # the recorded loss
    guard = RewardDropGuard()
    assert _drive(guard, rewards) == list(range(630, 1336))
    assert guard.best_step == 589 and guard.best == pytest.approx(sum(rewards[570:590]) / 20)
    assert guard.start == pytest.approx(sum(rewards[:20]) / 20)


@pytest.mark.parametrize("run", ["tool_quickstart_seed4", "quickstart_seed0", "quickstart_seed1", "quickstart_seed2"])
def test_runs_that_keep_what_they_learned_never_trip_it(run):
    rewards = SERIES[run]["reward_mean"]
    guard = RewardDropGuard()
    assert _drive(guard, rewards) == []
    assert guard.best - guard.start > 0.5  # they did learn: the guard was armed


def test_resumed_guard_fires_as_the_uninterrupted_one():
    rewards = SERIES["tool_quickstart_seed1"]["reward_mean"]
    whole = RewardDropGuard()
    expected = _drive(whole, rewards)
    first = RewardDropGuard()
    _drive(first, rewards[:600])
    resumed = RewardDropGuard()
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))  # as a checkpoint stores it
    assert _drive(resumed, rewards[600:], first_step=600) == expected


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"window": 0}, "RewardDropGuard.window must be >= 1, got 0"),
        ({"drop": 0.0}, r"RewardDropGuard.drop must be in \(0, 1\] \(the share of the gain lost\), got 0.0"),
        ({"drop": 1.5}, r"RewardDropGuard.drop must be in \(0, 1\]"),
        ({"min_gain": 0}, "RewardDropGuard.min_gain must be > 0, got 0"),
        ({"action": "fix"}, "RewardDropGuard.action must be one of warn, skip, stop; got 'fix'"),
    ],
)
def test_bad_settings_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RewardDropGuard(**kwargs)
