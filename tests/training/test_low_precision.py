"""A step of the learning rate that 16-bit weights round away is measured and said (training/low_precision.py)."""

from __future__ import annotations

import warnings

import lightning as L
import pytest
import torch

from lightning_grpo import GRPOModule
from lightning_grpo.training.low_precision import rounded_away_share, rounded_away_warning

from .test_module import _policy, _rollout_batch, _ticks


def _sgd(values, dtype, lr):
    return torch.optim.SGD([torch.nn.Parameter(torch.tensor(values, dtype=dtype))], lr=lr)


def test_the_share_counts_the_elements_a_step_leaves_unchanged():
    # bfloat16 spacing is 2**-7 above 1.0 and 2**-8 below it: 1e-3 < half of either, so +-1.0 stay; 2**-10 and 0
    # move (their neighbours are 2**-17 and 2**-133 away)
    share, elements, lr, dtype = rounded_away_share(_sgd([1.0, 2**-10, 0.0, -1.0], torch.bfloat16, 1e-3))
    assert (share, elements, lr, dtype) == (0.5, 4, 1e-3, torch.bfloat16)
    # float16 keeps 11 bits: spacing 2**-10 above 1.0, so 1e-3 (> 2**-11) lands on +-1.0 as well
    assert rounded_away_share(_sgd([1.0, 2**-10, 0.0, -1.0], torch.float16, 1e-3))[0] == 0.0
    assert rounded_away_share(_sgd([1.0, 0.05], torch.float32, 1e-9)) is None  # float32 weights are not read


def test_the_warning_names_the_dtype_the_share_and_the_fix_and_stays_quiet_when_steps_land():
    message = rounded_away_warning(_sgd([0.05] * 10, torch.bfloat16, 1e-5))  # spacing 2**-12 = 2.4e-4 at 0.05
    assert message is not None
    assert "stored in bfloat16" in message and "(1e-05) rounds away for 100% of their 10 elements" in message
    assert "--trainer.precision bf16-mixed" in message
    assert rounded_away_warning(_sgd([0.05] * 10, torch.bfloat16, 1e-3)) is None  # 1e-3 > 1.2e-4: every step lands


def _fit_one_step(path, precision: str) -> list[str]:
    policy = _policy(path)
    module = GRPOModule(model=policy, optimizer=lambda p: torch.optim.AdamW(p, lr=1e-5))
    module.use_rollout(_rollout_batch(policy.config.vocab_size))
    trainer = L.Trainer(
        max_steps=1,
        accelerator="cpu",
        precision=precision,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trainer.fit(module, train_dataloaders=_ticks(1))
    return [str(w.message) for w in seen if "rounds away" in str(w.message)]


@pytest.mark.parametrize(("precision", "warned"), [("bf16-true", True), ("bf16-mixed", False), ("32-true", False)])
def test_a_fit_with_bfloat16_weights_at_a_fine_tuning_rate_says_so_once(tiny_model_path, precision, warned):
    said = _fit_one_step(tiny_model_path, precision)
    assert len(said) == int(warned)
    if warned:
        assert said[0].startswith("the policy's trainable weights are stored in bfloat16")
