"""Which optimizer steps hand their metrics to ``LightningModule.log``
(:func:`lightning_grpo.training.metrics.hands_step_metrics_over`): the steps the loggers write, the last
step, a stopping step; the progress bar's reward every step."""

from __future__ import annotations

from types import SimpleNamespace

import lightning as L
import pytest
import torch

from lightning_grpo import DigitTask, GRPOModule, PromptDataModule, RewardSpec, RolloutCallback, SamplingConfig
from lightning_grpo.training.metrics import hands_step_metrics_over
from tests.helpers.guards import LOGS_EVERY_STEP


def _trainer(step: int, **overrides) -> SimpleNamespace:
    """What the rule reads of a Trainer, in the middle of optimizer step ``step`` (0-based)."""
    return SimpleNamespace(
        **{**LOGS_EVERY_STEP, "global_step": step, "log_every_n_steps": 10, "max_steps": 100, **overrides}
    )


@pytest.mark.parametrize(
    "step,overrides,handed",
    [
        (9, {}, True),  # the 10th step: the loggers write it
        (8, {}, False),
        (10, {}, False),
        (19, {}, True),
        (99, {}, True),  # the last of max_steps 100
        (96, {"max_steps": 97}, True),  # the last step, not a multiple of 10
        (3, {"should_stop": True}, True),  # the run stops here: Lightning writes this step too
        (3, {"fast_dev_run": 1}, True),
        (5, {"log_every_n_steps": 1}, True),
        (9, {"log_every_n_steps": 0}, False),  # the loggers write nothing
        (99, {"log_every_n_steps": 0}, True),  # still the final values after fit
        (4, {"max_steps": -1, "max_epochs": 2, "current_epoch": 1, "is_last_batch": True}, True),
        (4, {"max_steps": -1, "max_epochs": 2, "current_epoch": 0, "is_last_batch": True}, False),
        (4, {"max_steps": -1, "max_epochs": -1, "current_epoch": 5, "is_last_batch": True}, False),  # no end set
    ],
)
def test_the_steps_whose_metrics_are_handed_over(step, overrides, handed):
    assert hands_step_metrics_over(_trainer(step, **overrides)) is handed


class _RecordingModule(GRPOModule):
    """Records, per optimizer step, the names handed to ``self.log``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.handed: dict[int, set[str]] = {}

    def log(self, name, value, *args, **kwargs):
        self.handed.setdefault(self.trainer.global_step, set()).add(name)
        super().log(name, value, *args, **kwargs)


def test_a_run_hands_over_the_logged_steps_and_the_last_and_shows_the_reward_every_step(tiny_model_path, tmp_path):
    from transformers import AutoModelForCausalLM

    module = _RecordingModule(model=AutoModelForCausalLM.from_pretrained(tiny_model_path))
    rollout = RolloutCallback(
        engine="hf", sampling=SamplingConfig(n=4, max_new_tokens=2), rewards=[RewardSpec("prefix_match")], seed=0
    )
    trainer = L.Trainer(
        max_steps=5,
        log_every_n_steps=2,
        callbacks=[rollout],
        accelerator="cpu",
        logger=L.pytorch.loggers.CSVLogger(tmp_path, name="run"),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(module, datamodule=PromptDataModule(DigitTask(), batch_size=4))

    full = [step for step, names in sorted(module.handed.items()) if "train/loss" in names]
    assert full == [1, 3, 4]  # steps 2 and 4 (counted from 1) are written, step 5 is the last
    assert all("reward" in module.handed[step] for step in range(5))  # the progress bar, every step
    alarms = {f"alarm/{name}" for name in ("non_finite", "non_finite_logprobs", "entropy", "identical_samples")}
    alarms |= {"alarm/mismatch", "alarm/zero_reward_std", "alarm/truncation"}  # the default guards' quiet checks
    assert all(alarms <= module.handed[step] for step in full)
    assert not any(name.startswith(("train/", "alarm/")) for name in module.handed[0])
    assert torch.isfinite(trainer.callback_metrics["train/loss"])  # the final values after fit
    assert "train/reward_mean" in trainer.callback_metrics

    import csv

    (metrics,) = tmp_path.glob("run/*/metrics.csv")
    written = sorted({int(r["step"]) for r in csv.DictReader(metrics.open()) if r.get("train/loss")})
    assert written == [1, 3]  # what Lightning wrote is unchanged: every 2nd step
