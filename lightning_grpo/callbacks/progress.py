"""StepProgressBar: one bar over the run's optimizer steps (``step 140/1000``), for runs that stop at
``max_steps``.

Lightning's bar restarts each epoch and labels it ``Epoch N``; a GRPO run's "epoch" is one pass
over the prompts (37 steps of the quickstart), and with ``max_epochs`` unset the label showed
negative totals. This bar counts ``trainer.global_step`` up to ``max_steps`` across epochs (a
resumed run starts at its step) and leaves out the logger version (``v_num``). ``lightning-grpo``
uses it whenever the progress bar is on and no other one is configured.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar
from typing_extensions import override


class StepProgressBar(TQDMProgressBar):
    """TQDM bar of ``global_step / max_steps`` (see the module docstring)."""

    @override
    def on_train_start(self, *_: Any) -> None:
        super().on_train_start(*_)
        self._bar_started = False

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, *_: Any) -> None:
        if getattr(self, "_bar_started", False):  # one bar for the whole run
            return
        self._bar_started = True
        bar = self.train_progress_bar
        bar.reset(total=trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None)
        bar.initial = 0
        bar.n = trainer.global_step  # a resumed run starts at its step
        bar.set_description("step")
        bar.refresh()

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        bar = self.train_progress_bar
        step = trainer.global_step
        if bar is not None and bar.n != step and self._should_update(step, bar.total):
            bar.n = step
            bar.set_postfix(self.get_metrics(trainer, pl_module))
            bar.refresh()

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.train_progress_bar.disable:
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))

    @override
    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        return items
