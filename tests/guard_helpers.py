"""Driving a rollout-level guard without a run: a stand-in module and one metrics dict per step."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


class FakeModule:
    """What a rollout-level guard reads and writes: ``rollout_metrics`` and ``log``."""

    def __init__(self):
        self.rollout_metrics: dict[str, float] = {}
        self.logged: list[tuple[str, float]] = []

    def log(self, name, value, **kwargs):
        self.logged.append((name, value))


def drive(guard: Any, batches: list[dict[str, float]], group_size: int = 8, first_step: int = 0) -> list[int]:
    """Feed the guard one rollout batch's statistics per entry (steps from ``first_step``); the steps it fired at."""
    module = FakeModule()
    trainer = SimpleNamespace(global_step=0, global_rank=0, callbacks=[], loggers=[], log_dir=None)
    for step, metrics in enumerate(batches, start=first_step):
        trainer.global_step = step
        module.rollout_metrics = metrics
        guard.on_rollout_end(trainer, module, SimpleNamespace(group_size=group_size))
    return [a["step"] for a in guard.alarms]
