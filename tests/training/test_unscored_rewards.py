"""``model.algorithm.unscored``: a sample no reward function scores is left out of its group's baseline and
gets advantage 0 (``exclude``, the default, as TRL), or scores 0 in it (``zero``). From the reward set,
through the rollout callback, to the module's advantages."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch

from lightning_grpo import AlgorithmSettings, GRPOModule, PromptDataModule, RewardSpec, RolloutCallback, SamplingConfig
from lightning_grpo.data.tasks import DigitTask

from .test_module import _policy

REWARDS = torch.tensor([[1.0], [0.0], [0.0], [1.0]])  # [B, R]: row 1's 0 is a None
SCORED = torch.tensor([True, False, True, True])


@pytest.mark.parametrize(
    ("unscored", "expected"),
    [
        ("exclude", torch.tensor([1 / 3, 0.0, -2 / 3, 1 / 3]) / (math.sqrt(1 / 3) + 1e-6)),  # over [1, 0, 1]
        ("zero", torch.tensor([0.5, -0.5, -0.5, 0.5]) / (math.sqrt(1 / 3) + 1e-6)),  # over [1, 0, 0, 1]
    ],
)
def test_the_setting_chooses_the_baseline(tiny_model_path, unscored, expected):
    module = GRPOModule(model=_policy(tiny_model_path), algorithm=AlgorithmSettings(unscored=unscored))
    out = module.compute_advantages(REWARDS, torch.ones(1), 4, scored=SCORED)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)


def test_the_default_is_exclude_and_a_wrong_value_names_the_field():
    assert AlgorithmSettings().unscored == "exclude"
    with pytest.raises(ValueError, match=r"^model.algorithm.unscored must be 'exclude' or 'zero', got 'drop'$"):
        AlgorithmSettings(unscored="drop")


class Capture(L.Callback):
    def on_rollout_end(self, trainer, pl_module, batch):
        self.advantages = batch.advantages.detach().cpu().clone()


@pytest.mark.parametrize("unscored", ["exclude", "zero"])
def test_a_training_step_gives_unscored_samples_zero_and_leaves_them_out_of_the_baseline(tiny_model_path, unscored):
    """One step on the tiny model: a reward that returns None for the second sample of every group. With
    ``exclude`` the batch's advantages are grpo over each group's three scored samples and 0 for the
    unscored; with ``zero`` (the behaviour before the setting) grpo over all four, the None as 0."""
    seen: list[float | None] = []

    def odd_digit(completions, **_):
        out = [None if i % 4 == 1 else float(c[:1] in "13579") + 0.25 * (i % 4) for i, c in enumerate(completions)]
        seen[:] = out  # the last call: the step's batch (a probe before the fit calls it too)
        return out

    capture = Capture()
    rollout = RolloutCallback(
        engine="hf", sampling=SamplingConfig(n=4, max_new_tokens=2), rewards=[RewardSpec(odd_digit)], seed=3
    )
    trainer = L.Trainer(
        max_steps=1,
        callbacks=[rollout, capture],
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    L.seed_everything(0)
    with pytest.warns(UserWarning, match="every reward function returned None"):
        module = GRPOModule(model=_policy(tiny_model_path), algorithm=AlgorithmSettings(unscored=unscored))
        trainer.fit(module, datamodule=PromptDataModule(DigitTask(), batch_size=2))
    expected = []
    for p in range(2):
        scores = seen[4 * p : 4 * p + 4]
        if unscored == "zero":
            values = torch.tensor([0.0 if s is None else s for s in scores])
            expected += ((values - values.mean()) / (values.std() + 1e-6)).tolist()
            continue
        values = torch.tensor([s for s in scores if s is not None])
        adv = ((values - values.mean()) / (values.std() + 1e-6)).tolist()
        expected += [0.0 if s is None else adv.pop(0) for s in scores]
    torch.testing.assert_close(capture.advantages, torch.tensor(expected), rtol=0, atol=1e-6)
    assert (capture.advantages[[1, 5]] == 0).all() == (unscored == "exclude")
