"""Driving a rollout-level guard without a run: a stand-in module and one metrics dict per step."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

#: What ``lightning_grpo.training.metrics.hands_step_metrics_over`` reads of a Trainer that logs every step.
LOGS_EVERY_STEP = dict(
    log_every_n_steps=1,
    max_steps=-1,
    max_epochs=None,
    current_epoch=0,
    is_last_batch=False,
    should_stop=False,
    fast_dev_run=False,
)


class FakeModule:
    """What a rollout-level guard reads and writes: ``rollout_metrics`` and ``log``."""

    def __init__(self):
        self.rollout_metrics: dict[str, float] = {}
        self.logged: list[tuple[str, float]] = []

    def log(self, name, value, **kwargs):
        self.logged.append((name, value))


def drive(
    guard: Any, batches: list[dict[str, float]], group_size: int = 8, first_step: int = 0, callbacks: list = ()
) -> list[int]:
    """Feed the guard one rollout batch's statistics per entry (steps from ``first_step``; ``callbacks``: the
    Trainer's other callbacks); the steps it fired at."""
    module = FakeModule()
    trainer = SimpleNamespace(
        global_step=0, global_rank=0, callbacks=list(callbacks), loggers=[], log_dir=None, **LOGS_EVERY_STEP
    )
    for step, metrics in enumerate(batches, start=first_step):
        trainer.global_step = step
        module.rollout_metrics = metrics
        guard.on_rollout_end(trainer, module, SimpleNamespace(group_size=group_size))
    return [a["step"] for a in guard.alarms]


#: logged metrics a measured run (tests/fixtures/*.json) gives each guard hook: rollout-level, step-level
ROLLOUT_METRICS = (
    "reward_mean",
    "frac_reward_zero_std",
    "frac_groups_all_lowest",
    "reward_levels",
    "completion_length_mean",
)
STEP_METRICS = ("entropy", "mismatch_k3")


def replay(guard: Any, run: dict[str, Any]) -> list[int]:
    """Feed a guard a measured run's logged metrics in the order the run did (``on_rollout_end`` with the
    step's rollout metrics, ``on_before_optimizer_step`` with its loss metrics, ``on_validation_end`` at the
    run's validations after step 0, which the rollout callback logs without one); the steps it fired at."""
    module = FakeModule()
    module.step_metrics = SimpleNamespace(compute=lambda: step_metrics)
    trainer = SimpleNamespace(
        global_step=0,
        global_rank=0,
        world_size=1,
        callbacks=[],
        loggers=[],
        log_dir=None,
        sanity_checking=False,
        callback_metrics={},
        **LOGS_EVERY_STEP,
    )
    module.trainer = trainer
    validations = {step: value for step, value in run.get("val_reward_mean", []) if step > 0}
    batch = SimpleNamespace(group_size=8)
    for step in range(len(run["reward_mean"])):
        trainer.global_step = step
        module.rollout_metrics = {key: run[key][step] for key in ROLLOUT_METRICS if key in run}
        step_metrics = {key: run[key][step] for key in STEP_METRICS if key in run}
        if hasattr(guard, "on_rollout_end"):
            guard.on_rollout_end(trainer, module, batch)
        guard.on_before_optimizer_step(trainer, module, None)
        if step in validations:
            trainer.callback_metrics = {"val/reward_mean": validations[step]}
            guard.on_validation_end(trainer, module)
    return [a["step"] for a in guard.alarms]
