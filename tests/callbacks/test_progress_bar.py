"""Drop-in use (your own Trainer with ``max_steps``): Lightning's default progress bar, TQDM or Rich,
is shown as a bar of the run's steps (``step 2/2``), not of epochs (Rich read ``Epoch 2/-2``)."""

from __future__ import annotations

import logging

import lightning as L
import pytest
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar

from lightning_grpo import GRPOModule, PromptDataModule
from lightning_grpo.data.tasks import DigitTask
from tests.helpers.bad_input import hf_callback

pytestmark = pytest.mark.usefixtures("tiny_cache")


def _fit(bar, caplog) -> L.Trainer:
    trainer = L.Trainer(
        max_steps=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[hf_callback(), bar],
    )
    with caplog.at_level(logging.INFO):
        trainer.fit(GRPOModule(model="tiny:chars"), datamodule=PromptDataModule(DigitTask(), batch_size=4))
    assert not [r for r in caplog.records if "will override existing callbacks" in r.getMessage()]
    return trainer


def test_drop_in_tqdm_bar_counts_steps(caplog):
    bar = _fit(TQDMProgressBar(), caplog).progress_bar_callback
    progress = bar.train_progress_bar
    assert progress.desc == "step: " and (progress.n, progress.total) == (2, 2), (progress.desc, progress.n)


def test_drop_in_rich_bar_counts_steps(caplog):
    bar = _fit(RichProgressBar(), caplog).progress_bar_callback
    task = bar.progress.tasks[bar.train_progress_bar_id]
    assert task.description.strip() == "step" and (task.completed, task.total) == (2, 2), task
