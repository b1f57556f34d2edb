"""Guards stay quiet where their condition is a property of the task (a pass / fail reward makes
all-right / all-wrong groups normal) and still fire where the run really has no signal."""

from __future__ import annotations

import logging

import pytest

from lightning_grpo import ZeroStdGuard
from tests.helpers.guards import drive


def _batch(zero_std, lowest, reward, levels=2.0):
    return {
        "frac_reward_zero_std": zero_std,
        "frac_groups_all_lowest": lowest,
        "reward_mean": reward,
        "reward_levels": levels,
    }


def test_pass_fail_reward_cold_start_and_plateau_are_quiet_and_noted_once(caplog):
    """Quickstart seed 0 (measured): 78% zero-std groups at the cold start (reward 0.03), 98% on
    the plateau (reward 0.90: 88% of groups all right, 10% all wrong). Neither is a missing
    signal on a pass / fail reward; the guard says so once."""
    guard = ZeroStdGuard(threshold=0.75, window=3)
    cold = [_batch(0.78, 0.78, 0.03)] * 5
    plateau = [_batch(0.98, 0.10, 0.896)] * 5
    with caplog.at_level(logging.INFO, logger="lightning_grpo.guards"):
        assert drive(guard, cold + plateau) == []
    notes = [r.getMessage() for r in caplog.records]
    assert all(r.levelno == logging.INFO for r in caplog.records)  # a note: nothing on a default console
    assert len(notes) == 1 and notes[0].startswith("[zero_reward_std] note: the reward is pass / fail (two values)")
    assert "(0.78 at the reward mean 0.03)" in notes[0]  # 0.97 ** 8 + 0.03 ** 8 = 0.784
    assert guard.noted


def test_pass_fail_reward_that_never_pays_still_fires():
    guard = ZeroStdGuard(window=3)
    steps = drive(guard, [_batch(0.99, 0.99, 0.002)] * 4)
    assert steps == [2, 3]
    assert guard.alarms[0]["message"].startswith(
        "99% of groups got the lowest reward on every sample (pass / fail reward) over the last 3 batches"
    )


@pytest.mark.parametrize(
    ("levels", "fires"),
    [(1.0, True), (3.0, True), (2.0, False)],  # a constant reward, a graded reward, pass / fail
)
def test_the_pass_fail_rule_applies_only_to_two_valued_rewards(levels, fires):
    guard = ZeroStdGuard(threshold=0.75, window=2)
    steps = drive(guard, [_batch(0.8, 0.5, 0.3, levels=levels)] * 3)
    assert steps == ([1, 2] if fires else [])
    if fires:
        assert "have zero reward std over the last 2 batches" in guard.alarms[0]["message"]


def test_pass_fail_threshold_none_keeps_the_plain_rule():
    guard = ZeroStdGuard(threshold=0.75, window=2, pass_fail_threshold=None)
    assert drive(guard, [_batch(0.8, 0.5, 0.3)] * 3) == [1, 2]
    assert not guard.noted


def test_pass_fail_note_only_when_it_matters_and_in_one_short_line(caplog):
    """A healthy pass / fail run (zero-std groups below ``threshold``) gets no note; one where they reach
    it gets the note once, as one line that fits two terminal lines."""
    healthy = ZeroStdGuard(threshold=0.75, window=3)
    with caplog.at_level(logging.INFO, logger="lightning_grpo.guards"):
        assert drive(healthy, [_batch(0.4, 0.2, 0.5)] * 6) == []
    assert caplog.records == [] and not healthy.noted
    guard = ZeroStdGuard(threshold=0.75, window=3)
    with caplog.at_level(logging.INFO, logger="lightning_grpo.guards"):
        assert drive(guard, [_batch(0.78, 0.78, 0.03)] * 6) == []
    (note,) = [r.getMessage() for r in caplog.records]
    assert "\n" not in note and len(note) <= 160, (len(note), note)
