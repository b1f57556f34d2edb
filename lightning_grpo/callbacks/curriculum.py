"""CurriculumCallback: raise a task's difficulty level when the policy's accuracy on it passes a threshold.

Works with any data source that has curriculum levels (`CurriculumSource`; built in:
`ReasoningGymSource`). Every ``check_every_n_steps``
optimizer steps, for each task that follows a curriculum: greedy accuracy (the mean of the first
reward function, as ``val/greedy_accuracy``) on up to ``eval_prompts`` of the task's current
training prompts; when it reaches ``threshold`` and the task is below its top level, the source
moves the task one level up and the data module re-reads its training rows
(``PromptDataModule.refresh_train``). Written to the loggers at every check:
``curriculum/<task>/accuracy`` and ``curriculum/<task>/level`` (the level after the check); a log
line per raise.

The levels are the callback's state (``state_dict``): a resumed run goes on at the levels it had
reached, with the training rows of those levels.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol, runtime_checkable

import lightning as L
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from .lookup import find_callback

log = logging.getLogger("lightning_grpo.curriculum")


@runtime_checkable
class CurriculumSource(Protocol):
    """A data source whose tasks have difficulty levels (0 = easiest)."""

    def curriculum_tasks(self) -> list[str]: ...  # the tasks that follow a curriculum

    def level(self, name: str) -> int: ...

    def max_level(self, name: str) -> int: ...

    def set_level(self, name: str, level: int) -> None: ...  # the next train_rows() draws at it


@runtime_checkable
class RefreshableData(Protocol):
    """A data module whose training rows are drawn again from its source on request (`PromptDataModule`)."""

    source: Any  # data.source

    def refresh_train(self) -> None: ...  # draw the training rows again (at the source's levels now)


class CurriculumCallback(Callback):
    """Raise a task's level when its accuracy reaches ``threshold`` (see the module docstring).

    Args:
        threshold: Greedy accuracy in (0, 1] at which a task moves up one level.
        check_every_n_steps: Optimizer steps between two checks (>= 1).
        eval_prompts: Training prompts of a task evaluated per check (its first ones, >= 1).
        task_column: Record column holding the task name.
    """

    def __init__(
        self, threshold: float = 0.8, check_every_n_steps: int = 100, eval_prompts: int = 32, task_column: str = "task"
    ) -> None:
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold <= 1:
            raise ValueError(f"CurriculumCallback.threshold must be a number in (0, 1], got {threshold!r}")
        for name, value in (("check_every_n_steps", check_every_n_steps), ("eval_prompts", eval_prompts)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"CurriculumCallback.{name} must be an integer >= 1, got {value!r}")
        self.threshold, self.every, self.eval_prompts, self.task_column = (
            float(threshold),
            check_every_n_steps,
            eval_prompts,
            task_column,
        )
        #: ``{"step", "task", "accuracy", "level"}`` of every raise, in order.
        self.raises: list[dict[str, Any]] = []
        self.source: CurriculumSource | None = None  # the data module's, from setup on
        self._restored: dict[str, int] | None = None
        self._checked_at = -1

    @staticmethod
    def _source(trainer: L.Trainer) -> CurriculumSource:
        dm = trainer.datamodule
        source = dm.source if isinstance(dm, RefreshableData) else None
        if not isinstance(source, CurriculumSource):
            raise RuntimeError(
                "CurriculumCallback needs a PromptDataModule whose data.source has curriculum levels "
                f"(curriculum_tasks, level, max_level, set_level; e.g. ReasoningGymSource), got {type(source).__name__}"
            )
        return source

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.source = self._source(trainer)
        if not self.source.curriculum_tasks():
            raise ValueError(
                "CurriculumCallback: no task of data.source follows a curriculum; give a task a level (e.g. level: 0)"
            )

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """After a resume: back to the levels the run had reached, with their training rows."""
        if self._restored is None:
            return
        source = self._source(trainer)
        changed = False
        for task, level in self._restored.items():
            if task in source.curriculum_tasks() and source.level(task) != level:
                source.set_level(task, level)
                changed = True
        if changed:
            trainer.datamodule.refresh_train()
        self._restored = None

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if step == 0 or step % self.every or self._checked_at == step:
            return  # several micro-batches per optimizer step end at the same global_step: check once
        self._checked_at = step
        self.check(trainer, pl_module)

    def check(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, float]:
        """Evaluate every curriculum task, raise those at or above the threshold; returns the accuracies."""
        source = self._source(trainer)
        from .rollout import RolloutCallback

        rollout = find_callback(trainer, RolloutCallback, needed_by=self)
        accuracy: dict[str, float] = {}
        for task in source.curriculum_tasks():
            records = [r for r in trainer.datamodule.train_records if r.get(self.task_column) == task][
                : self.eval_prompts
            ]
            if records:
                accuracy[task] = float(rollout.evaluate(pl_module, records)["val/greedy_accuracy"])
        # every rank moves together: rank 0's verdict
        raise_tasks = trainer.strategy.broadcast(
            [t for t, acc in accuracy.items() if acc >= self.threshold and source.level(t) < source.max_level(t)], src=0
        )
        for task in raise_tasks:
            level = source.level(task) + 1
            source.set_level(task, level)
            self.raises.append({"step": trainer.global_step, "task": task, "accuracy": accuracy[task], "level": level})
            if trainer.global_rank == 0:
                log.info(
                    "[curriculum] step %d: %s accuracy %.2f >= %.2f -> level %d",
                    trainer.global_step,
                    task,
                    accuracy[task],
                    self.threshold,
                    level,
                )
        if raise_tasks:
            trainer.datamodule.refresh_train()
        metrics = {}
        for task, acc in accuracy.items():
            metrics.update({f"curriculum/{task}/accuracy": acc, f"curriculum/{task}/level": float(source.level(task))})
        for logger in trainer.loggers if trainer.global_rank == 0 else ():  # at every check, not only on logging steps
            logger.log_metrics(metrics, step=trainer.global_step)
        return accuracy

    # ------------------------------------------------------------------------------ state
    @override
    def state_dict(self) -> dict[str, Any]:
        if self.source is None:  # not set up (yet): what it was given
            levels = dict(self._restored or {})
        else:
            levels = {task: self.source.level(task) for task in self.source.curriculum_tasks()}
        return {"levels": levels, "raises": list(self.raises)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._restored = dict(state_dict.get("levels", {}))
        self.raises = list(state_dict.get("raises", []))
