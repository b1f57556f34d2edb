"""Callbacks: the Lightning callbacks that drive a run (rollout, guards, curriculum, saving, logging).

:class:`~lightning_grpo.callbacks.rollout.RolloutCallback` samples each generation batch; the guards,
controllers and savers watch and steer training; :mod:`.distributed` keeps multi-process runs from
hanging silently.

Importing this package registers what a :class:`~lightning_grpo.GRPOModule` brings to its Trainer
(:data:`lightning_grpo.training.defaults.MODULE_CALLBACKS`): the default guard set, the step progress bar and the
one-line model summary.

May import: ``core``, ``models``, ``data``, ``rollout``, ``training``, ``checks``, ``plan``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import lightning as L

from ..training.defaults import MODULE_CALLBACKS

if TYPE_CHECKING:
    from ..training.module import GRPOModule


@MODULE_CALLBACKS.register("1-guards")
def _default_guards(trainer: L.Trainer, module: GRPOModule) -> list:
    """The default guard set (:mod:`.guard_set`) unless ``model.default_guards`` is off or the Trainer names a guard."""
    from .guard_set import Guard, default_guards

    if not module.default_guards or any(isinstance(c, Guard) for c in trainer.callbacks):
        return []
    return default_guards()


@MODULE_CALLBACKS.register("2-step-bar")
def _step_bar(trainer: L.Trainer, module: GRPOModule) -> list:
    """A bar of the run's steps for a ``max_steps`` run with Lightning's default bar (:func:`.progress.step_bar_for`)."""
    from .progress import step_bar_for

    bar = step_bar_for(trainer)
    return [] if bar is None else [bar]


@MODULE_CALLBACKS.register("3-summary")
def _summary(trainer: L.Trainer, module: GRPOModule) -> list:
    """One line about the policy in place of Lightning's default model summary (:func:`.progress.summary_for`)."""
    from .progress import summary_for

    summary = summary_for(trainer)
    return [] if summary is None else [summary]
