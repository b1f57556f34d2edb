"""EntropyController: holds train/entropy in its band by moving one knob of the loss."""

from __future__ import annotations

from types import SimpleNamespace

import lightning as L
import pytest
import torch

from lightning_grpo import (
    EntropyController,
    GRPOLoss,
    GRPOModule,
    PromptDataModule,
    RewardSpec,
    RolloutCallback,
    SamplingConfig,
)
from lightning_grpo.callbacks.entropy_control import KnobRange
from lightning_grpo.data.tasks import DigitTask
from tests.helpers.guards import LOGS_EVERY_STEP


class FakeModule:
    """The parts of GRPOModule the controller uses: loss_fn, step_metrics, log."""

    def __init__(self, loss):
        self.loss_fn = loss
        self.entropy = 0.0
        self.logged: dict[str, float] = {}
        self.step_metrics = SimpleNamespace(compute=lambda: {"entropy": self.entropy})

    def log(self, name, value, **kwargs):
        self.logged[name] = value


def _drive(controller, module, entropies):
    trainer = SimpleNamespace(world_size=1, global_step=0, **LOGS_EVERY_STEP)
    controller.setup(trainer, module, "fit")
    controller.on_train_start(trainer, module)
    values = []
    for h in entropies:
        module.entropy = h
        controller.on_before_optimizer_step(trainer, module, None)
        values.append(round(module.loss_fn.knob(controller.knob), 6))
    return values


def test_moves_are_one_step_per_window_and_bounded():
    loss = GRPOLoss()
    controller = EntropyController(knob="entropy_coef", floor=0.5, ceiling=2.0, window=2, step=0.01, high=0.02)
    # window 2: the first decision after 2 steps; after a move the window starts afresh
    values = _drive(
        controller, FakeModule(loss), [0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 1.0, 1.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0]
    )
    assert values == [0.0, 0.01, 0.01, 0.02, 0.02, 0.02, 0.02, 0.02, 0.02, 0.01, 0.01, 0.0, 0.0, 0.0]
    assert controller.moves == 4 and loss.terms.entropy_coef == 0.0


def test_eps_high_never_goes_below_its_configured_value_and_ratios_move_by_a_factor():
    loss = GRPOLoss(policy_loss_args={"eps_high": 0.28})
    values = _drive(
        EntropyController(knob="eps_high", floor=0.5, ceiling=1.0, window=1),
        FakeModule(loss),
        [0.1, 0.1, 2.0, 2.0, 2.0],
    )
    assert values == [0.3, 0.32, 0.3, 0.28, 0.28]
    loss = GRPOLoss(policy_loss="kl_cov")
    values = _drive(EntropyController(knob="kl_cov_ratio", floor=0.5, window=1), FakeModule(loss), [0.1, 0.1])
    assert values == [4e-4, 8e-4]
    assert KnobRange(step=2.0, low=0.0, high=1.0, factor=True).move(0.0, 1) == 0.0  # a factor cannot leave 0


def test_one_decision_for_all_ranks_is_rank_zeros():
    """Under DDP the direction is broadcast from rank 0 (tests/e2e/test_distributed.py runs it on 2 ranks)."""
    loss = GRPOLoss()
    controller = EntropyController(floor=0.5, window=1)
    module = FakeModule(loss)
    trainer = SimpleNamespace(
        world_size=2,
        strategy=SimpleNamespace(broadcast=lambda obj, src: -1 if obj == 1 else obj),
        global_step=0,
        **LOGS_EVERY_STEP,
    )
    controller.setup(trainer, module, "fit")
    controller.on_train_start(trainer, module)
    loss.set_knob("entropy_coef", 0.01)
    controller.value = 0.01
    module.entropy = 0.1  # this rank would raise the knob; rank 0 says lower it
    controller.on_before_optimizer_step(trainer, module, None)
    assert loss.terms.entropy_coef == pytest.approx(0.005)
    assert module.logged == {"entropy_control/entropy_coef": pytest.approx(0.005), "entropy_control/direction": -1.0}


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: EntropyController(knob="lr"),
            r"EntropyController.knob must be one of entropy_coef, eps_high, clip_ratio, kl_cov_ratio; got 'lr'",
        ),
        (
            lambda: EntropyController(floor=1.0, ceiling=0.5),
            r"EntropyController.ceiling must be > floor \(1.0\), got 0.5",
        ),
        (lambda: EntropyController(window=0), r"EntropyController.window must be >= 1, got 0"),
        (lambda: EntropyController(knob="clip_ratio", step=0.5), r"EntropyController: need step > 1 and low <= high"),
    ],
)
def test_settings_are_checked(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_a_knob_the_loss_lacks_fails_before_training():
    controller = EntropyController(knob="eps_high")
    with pytest.raises(
        ValueError,
        match=r"EntropyController.knob 'eps_high' does not apply to this loss \(its knobs: entropy_coef, kl_cov_ratio",
    ):
        controller.setup(SimpleNamespace(), FakeModule(GRPOLoss(policy_loss="kl_cov")), "fit")


def _policy(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path)


def _fit(module, callbacks, steps, ckpt_path=None):
    rollout = RolloutCallback(
        engine="hf",
        sampling=SamplingConfig(n=8, temperature=1.0, max_new_tokens=2),
        rewards=[RewardSpec("prefix_match")],
        seed=0,
    )
    L.seed_everything(0)
    trainer = L.Trainer(
        max_steps=steps,
        callbacks=[rollout, *callbacks],
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(module, datamodule=PromptDataModule(DigitTask(), batch_size=8), ckpt_path=ckpt_path)
    return trainer


class EntropyTrace(L.Callback):
    def __init__(self):
        self.entropy: list[float] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.entropy.append(pl_module.step_metrics.compute()["entropy"])


def test_a_collapsing_run_gets_its_entropy_back(tiny_model_path):
    """lr 1e-2 collapses the entropy from 3.9 to ~0.2 by step 35 (measured; the EntropyGuard test
    provokes the same collapse). The controller raises the entropy bonus from then on and the
    entropy is back above the floor at the end."""
    module = GRPOModule(
        model=_policy(tiny_model_path), optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.0)
    )
    controller, trace = EntropyController(floor=0.5, window=3, step=0.02), EntropyTrace()
    _fit(module, [controller, trace], steps=45)
    assert min(trace.entropy) < 0.5  # it did collapse
    assert min(trace.entropy[-3:]) > 0.5, trace.entropy  # and came back
    assert 0 < module.loss_fn.terms.entropy_coef <= 0.1 and controller.moves >= 2


def test_the_knob_value_survives_a_checkpoint(tiny_model_path, tmp_path):
    module = GRPOModule(model=_policy(tiny_model_path))
    trainer = _fit(module, [EntropyController(floor=100.0, window=1)], steps=2)  # below the floor: +0.005 per step
    assert module.loss_fn.terms.entropy_coef == pytest.approx(0.01)
    trainer.save_checkpoint(tmp_path / "run.ckpt")
    resumed, controller = GRPOModule(model=_policy(tiny_model_path)), EntropyController(floor=100.0, window=1)
    _fit(resumed, [controller], steps=3, ckpt_path=tmp_path / "run.ckpt")
    assert resumed.loss_fn.terms.entropy_coef == pytest.approx(0.015) and controller.moves == 3
