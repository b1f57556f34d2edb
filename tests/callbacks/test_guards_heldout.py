"""The guards' thresholds on runs none of them was designed on: tests/fixtures/guard_series_heldout.json
(``python benchmarks/reward_series.py --set heldout``), each run from its own seed's initialisation.
The guards are replayed on the logged metrics of every step (tests/helpers/guards.replay); the recipes'
always-on guards also ran in the runs themselves, and the replay must give the alarms the runs recorded.
docs/guide/stability.md reports the figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_grpo import EntropyGuard, LengthGuard, MismatchGuard, RewardDropGuard, RewardHackingGuard, ZeroStdGuard
from tests.helpers.guards import replay

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
HELDOUT = json.loads((FIXTURES / "guard_series_heldout.json").read_text())
#: the always-on guards as every recipe configures them (recipes/*.yaml), by alarm name
RECIPE_GUARDS = {
    "entropy": lambda: EntropyGuard(floor=0.05, max_reward=0.9),
    "zero_reward_std": lambda: ZeroStdGuard(max_reward=0.9),
    "mismatch": MismatchGuard,
}


#: the alarms the runs recorded (alarms.jsonl), as (first, last) step spans per guard; no other guard fired
IN_RUN = {
    "tool_quickstart_seed1": {},
    "tool_quickstart_seed2": {"zero_reward_std": [(146, 172)]},
    "tool_control_seed5": {},
    "tool_control_seed6": {},
    "quickstart_seed3": {"entropy": [(623, 623), (625, 625), (630, 630), (633, 634), (638, 639), (643, 643),
                                     (646, 648), (897, 897), (900, 907), (909, 910)]},
    "quickstart_seed4": {},
    "quickstart_seed5": {},
    "quickstart_seed6": {},
    "quickstart_seed7": {},
}  # fmt: skip  # a run a line, not one step span a line
#: RewardDropGuard() replayed: tool seed 1 loses its tool call at step 299; the others keep their behaviour
REWARD_DROP = {run: [] for run in IN_RUN} | {"tool_quickstart_seed1": [(312, 407)]}
#: RewardHackingGuard() replayed (validations every 100 steps on the tool quickstart, 250 on the quickstart)
REWARD_HACKING = {
    "tool_quickstart_seed1": [299, 699],
    "tool_quickstart_seed2": [799, 1799],
    "tool_control_seed5": [],
    "tool_control_seed6": [],
} | {f"quickstart_seed{seed}": [749] for seed in range(3, 8)}
#: steps with at least a quarter of the groups token-identical (IdenticalSamplesGuard's threshold)
IDENTICAL_STEPS = {
    "tool_quickstart_seed1": 0,
    "tool_quickstart_seed2": 0,
    "tool_control_seed5": 58,
    "tool_control_seed6": 0,
    "quickstart_seed3": 764,
    "quickstart_seed4": 790,
    "quickstart_seed5": 767,
    "quickstart_seed6": 796,
    "quickstart_seed7": 799,
}
#: ZeroStdGuard() (the class default, max_reward None) where it differs from the recipes' ZeroStdGuard(max_reward=0.9)
ZERO_STD_DEFAULT = {
    "quickstart_seed4": [(610, 616), (621, 634), (637, 659), (737, 737)],
    "quickstart_seed7": [(520, 532), (551, 551), (808, 855), (867, 872), (895, 944), (973, 983)],
}


def _steps(spans):
    return [step for first, last in spans for step in range(first, last + 1)]


@pytest.mark.parametrize("run", sorted(IN_RUN))
def test_the_recipe_guards_replayed_fire_where_they_fired_in_the_run(run):
    """The recipe's EntropyGuard, ZeroStdGuard and MismatchGuard, fed the logged metrics, fire at the steps the
    run recorded; IdenticalSamplesGuard, NonFiniteGuard and LogProbGuard never fired in any of the runs."""
    recorded = HELDOUT[run]["alarms"]
    assert {name: _steps(spans) for name, spans in IN_RUN[run].items()} == recorded
    for name, make in RECIPE_GUARDS.items():
        assert replay(make(), HELDOUT[run]) == recorded.get(name, []), name


@pytest.mark.parametrize(("run", "spans"), REWARD_DROP.items())
def test_reward_drop_defaults_on_the_heldout_runs(run, spans):
    guard = RewardDropGuard()
    assert replay(guard, HELDOUT[run]) == _steps(spans)
    assert guard.best - guard.start >= guard.min_gain  # every run armed it, the control at chance too


def test_the_control_at_chance_comes_within_a_point_of_a_false_alarm():
    """The tool quickstart without the tool (reward at chance): its 20-batch mean went 0.015 -> 0.123 (a gain
    of 0.108, just over min_gain 0.1) and back to 0.070 at step 1920, 48.5% of the gain: quiet at drop 0.5,
    an alarm at 0.48 or with window 10."""
    run = HELDOUT["tool_control_seed5"]
    assert replay(RewardDropGuard(drop=0.48), run) == [1920]
    assert replay(RewardDropGuard(window=10), run)[0] == 513


def test_the_heldout_loss_of_the_tool_call_is_detected_13_steps_later():
    """Tool quickstart seed 1 (its own initialisation): sampled call rate 1.00 -> 0 at step 299; the default
    guard fires from step 312 until the call is back (step 407), as on the design run (ten steps after the loss)."""
    run = HELDOUT["tool_quickstart_seed1"]
    rate = run["tool_call_rate"]
    assert min(rate[250:299]) > 0.9 and rate[299] < 0.1  # the loss
    guard = RewardDropGuard()
    assert replay(guard, run)[0] == 312
    assert max(rate[400:408]) > 0.9  # the call is back when the alarm ends


@pytest.mark.parametrize(("run", "steps"), REWARD_HACKING.items())
def test_reward_hacking_defaults_fire_on_tool_runs_where_nothing_is_hacked(run, steps):
    """A known failure of the defaults (docs/guide/stability.md): on the tool quickstart the held-out (greedy) reward
    runs ahead of the sampled training reward, so the training reward rises 'alone' while nothing is hacked."""
    assert replay(RewardHackingGuard(), HELDOUT[run]) == steps


@pytest.mark.parametrize("run", sorted(IN_RUN))
def test_length_guard_defaults_stay_quiet(run):
    assert replay(LengthGuard(), HELDOUT[run]) == []


@pytest.mark.parametrize("run", sorted(IN_RUN))
def test_zero_std_guard_without_the_recipes_max_reward_fires_on_learned_quickstarts(run):
    """The class default (max_reward None) on quickstart seeds 4 and 7: their learned batches are all right (one
    reward level, so not pass / fail) and count as groups without signal; the recipes' max_reward 0.9 keeps it
    quiet. On the other runs the default fires where the recipe's guard did."""
    expected = (
        _steps(ZERO_STD_DEFAULT[run]) if run in ZERO_STD_DEFAULT else HELDOUT[run]["alarms"].get("zero_reward_std", [])
    )
    assert replay(ZeroStdGuard(), HELDOUT[run]) == expected
