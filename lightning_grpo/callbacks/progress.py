"""StepProgressBar: one bar over the run's optimizer steps (``step 140/1000``), for runs that stop at
``max_steps``.

Lightning's bar restarts each epoch and labels it ``Epoch N``; a GRPO run's "epoch" is one pass
over the prompts (37 steps of the quickstart), and with ``max_epochs`` unset the label showed
negative totals. This bar counts ``trainer.global_step`` up to ``max_steps`` across epochs (a
resumed run starts at its step) and leaves out the logger version (``v_num``). ``lightning-grpo``
uses it whenever the progress bar is on and no other one is configured. :class:`StepRichProgressBar`
does the same for Lightning's Rich bar, which labelled a ``max_steps`` run ``Epoch 2/-2``; in drop-in
use, :class:`~lightning_grpo.training.module.GRPOModule` swaps Lightning's default bar for the one of
its kind (:func:`step_bar_for`).

:class:`PolicySummary` puts one line about the policy (class, parameters, how many train) in place of Lightning's
model summary table, whose FLOPs column reads 0 for every GRPO run (FLOPs are counted on an example input; a
language model's batches are the rollouts); ``GRPOModule`` swaps Lightning's default summary for the one of its
kind (:func:`summary_for`); a summary you configure yourself is kept.
"""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelSummary, RichModelSummary, RichProgressBar, TQDMProgressBar
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.model_summary import get_human_readable_count
from typing_extensions import override


class StepProgressBar(TQDMProgressBar):
    """TQDM bar of ``global_step / max_steps`` (see the module docstring)."""

    _bar_started = False  # one bar for the whole run: set when the first epoch starts

    @override
    def on_train_start(self, *_: Any) -> None:
        super().on_train_start(*_)
        self._bar_started = False

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, *_: Any) -> None:
        if self._bar_started:
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


class StepRichProgressBar(RichProgressBar):
    """Rich bar of ``global_step / max_steps`` (:class:`StepProgressBar` for Lightning's Rich bar)."""

    @property
    @override
    def total_train_batches(self) -> int | float:
        max_steps = self.trainer.max_steps
        return max_steps if max_steps and max_steps > 0 else super().total_train_batches

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.train_progress_bar_id is not None:  # one bar for the whole run
            return
        super().on_train_epoch_start(trainer, pl_module)
        self._update(self.train_progress_bar_id, trainer.global_step)  # a resumed run starts at its step

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self._update(self.train_progress_bar_id, trainer.global_step)
        self.refresh()

    @override
    def _get_train_description(self, current_epoch: int) -> str:
        return f"{'step':{len(self.validation_description)}}"

    @override
    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        return items


def step_bar_for(trainer: L.Trainer) -> StepProgressBar | StepRichProgressBar | None:
    """The step bar to show instead of ``trainer``'s progress bar: for a ``max_steps`` run whose bar is
    Lightning's own default (exactly TQDMProgressBar or RichProgressBar), the step bar of its kind;
    None for any other bar, no bar, or a run without ``max_steps``."""
    if not (trainer.max_steps and trainer.max_steps > 0):
        return None
    kind = type(trainer.progress_bar_callback)
    if kind not in (TQDMProgressBar, RichProgressBar):
        return None
    quiet_swap_note()
    return StepProgressBar() if kind is TQDMProgressBar else StepRichProgressBar()


def quiet_swap_note() -> None:
    """Filter Lightning's note that the module's callbacks replace the Trainer's default bar or summary: expected
    here (:func:`step_bar_for`, :func:`summary_for`); installed once."""
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if _skip_swap_note not in rank_zero.filters:
        rank_zero.addFilter(_skip_swap_note)


#: The start of Lightning's note when a module's callback replaces one of the Trainer's.
_SWAP_NOTE = "The following callbacks returned in `LightningModule.configure_callbacks` will override existing callbacks passed to Trainer: "
#: The Trainer's defaults the module swaps for its own.
_SWAPPED = {"TQDMProgressBar", "RichProgressBar", "ModelSummary", "RichModelSummary"}


def _skip_swap_note(record: logging.LogRecord) -> bool:
    """False for Lightning's note when every callback it names is a default the module swaps."""
    message = record.getMessage()
    return not (message.startswith(_SWAP_NOTE) and set(message[len(_SWAP_NOTE) :].split(", ")) <= _SWAPPED)


# ------------------------------------------------------------------ the model summary
def summary_line(module: L.LightningModule) -> str:
    """``policy Qwen2ForCausalLM: 88.8 K parameters, all trainable`` (for a LoRA policy: the trainable count
    and its share)."""
    policy = module.policy
    total = sum(p.numel() for p in policy.parameters())
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    share = (
        "all trainable"
        if trainable == total
        else f"{get_human_readable_count(trainable)} trainable ({trainable / total:.2%})"
    )
    return f"policy {type(policy).__name__}: {get_human_readable_count(total)} parameters, {share}"


class PolicySummary(ModelSummary):
    """Lightning's :class:`ModelSummary` as one line (:func:`summary_line`)."""

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._max_depth and trainer.is_global_zero:
            rank_zero_info(summary_line(pl_module))


class RichPolicySummary(RichModelSummary):
    """Lightning's :class:`RichModelSummary` (the default next to the Rich bar) as one line."""

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._max_depth and trainer.is_global_zero:
            rank_zero_info(summary_line(pl_module))


def summary_for(trainer: Any) -> PolicySummary | RichPolicySummary | None:
    """The one-line summary to show instead of the Trainer's: for Lightning's own default summary (exactly
    ModelSummary or RichModelSummary), ours of its kind; None for any other summary or none."""
    kinds = {ModelSummary: PolicySummary, RichModelSummary: RichPolicySummary}
    found = [kinds[type(c)] for c in trainer.callbacks if type(c) in kinds]
    if not found:
        return None
    quiet_swap_note()
    return found[0]()
