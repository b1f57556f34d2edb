"""``action="fix"``: guards that know a remedy apply it through the object that owns the setting."""

from __future__ import annotations

import copy

import lightning as L
import pytest
import torch

from lightning_grpo import (
    EntropyGuard,
    GRPOModule,
    MismatchGuard,
    NonFiniteGuard,
    PromptDataModule,
    RewardSpec,
    RolloutCallback,
    SamplingConfig,
    SelectionSettings,
    ZeroStdGuard,
)
from lightning_grpo.callbacks.settings import WeightSyncSettings
from lightning_grpo.data.tasks import DigitTask
from lightning_grpo.rollout.hf import HFEngine

EOS, PAD = 1, 0


def _policy(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path)


def _fit(module, rollout, callbacks, steps):
    L.seed_everything(0)
    trainer = L.Trainer(
        max_steps=steps,
        callbacks=[rollout, *callbacks],
        accelerator="cpu",
        logger=False,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(module, datamodule=PromptDataModule(DigitTask(), batch_size=4))
    return trainer


def constant_reward(completions, **columns):
    return [0.5] * len(completions)


def test_zero_std_fix_switches_on_dynamic_sampling_then_raises_the_temperature(tiny_model_path):
    module = GRPOModule(model=_policy(tiny_model_path))
    rollout = RolloutCallback(
        engine="hf",
        sampling=SamplingConfig(n=4, temperature=1.0, max_new_tokens=2),
        rewards=[RewardSpec(constant_reward)],
        seed=3,
        selection=SelectionSettings(max_generation_rounds=2),
    )
    temperatures = []

    class Seen(L.Callback):
        def on_rollout_end(self, trainer, pl_module, batch):
            temperatures.append(batch.temperature)

    guard = ZeroStdGuard(threshold=0.5, window=1, action="fix", max_temperature=1.2)
    _fit(module, rollout, [guard, Seen()], steps=5)
    assert [a["action"] for a in guard.alarms] == ["fix", "fix", "fix", "warn", "warn"]
    messages = [a["message"].split(" -> fixed: ")[-1] for a in guard.alarms[:3]]
    assert messages[0].startswith("dynamic sampling switched on")
    assert messages[1:] == [
        "sampling temperature raised 1 -> 1.1 (max_temperature 1.2)",
        "sampling temperature raised 1.1 -> 1.2 (max_temperature 1.2)",
    ]
    assert guard.alarms[3]["message"].endswith("(no automatic remedy left)")
    assert rollout.dynamic_sampling and rollout.sampling.temperature == 1.2
    assert temperatures == [1.0, 1.0, 1.1, 1.2, 1.2]  # the batch (and its log-probs) use the new temperature
    restored = RolloutCallback(engine="hf", sampling=SamplingConfig(n=4))
    restored.load_state_dict(rollout.state_dict())  # what a checkpoint keeps
    assert restored.dynamic_sampling and restored.sampling.temperature == 1.2


def test_mismatch_fix_switches_on_tis_in_the_loss(tiny_model_path):
    """An engine that never receives the trained weights (a frozen copy of the policy): the
    mismatch grows, the guard switches on token-level TIS once, then only warns."""
    policy = _policy(tiny_model_path)
    module = GRPOModule(model=policy, optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2))
    rollout = RolloutCallback(
        engine="hf",
        sampling=SamplingConfig(n=4, temperature=1.0, max_new_tokens=3),
        rewards=[RewardSpec("prefix_match")],
        weight_sync=WeightSyncSettings(check_every=0),  # the stale engine is the point: the push check would stop it
        seed=3,
    )
    rollout.use_engine(HFEngine(copy.deepcopy(policy), EOS, PAD))
    guard = MismatchGuard(max_k3=1e-3, action="fix")
    assert module.loss_fn.correction is None
    trainer = _fit(module, rollout, [guard], steps=6)
    actions = [a["action"] for a in guard.alarms]
    assert actions[0] == "fix" and set(actions[1:]) <= {"warn"}
    assert guard.alarms[0]["message"].endswith(
        "-> fixed: correction tis_token switched on in the loss (GRPOLoss.set_correction)"
    )
    assert module.loss_fn.correction == "tis_token" and guard.applied
    assert "train/is_weight_mean" in trainer.callback_metrics  # the correction's metrics are logged
    assert guard.state_dict() == {"applied": True}


@pytest.mark.parametrize("build", [lambda: NonFiniteGuard(action="fix"), lambda: EntropyGuard(floor=0.1, action="fix")])
def test_fix_is_refused_by_guards_without_a_remedy(build):
    with pytest.raises(ValueError, match=r"action must be one of warn, skip, stop; got 'fix'"):
        build()


def test_an_unknown_correction_fails_at_construction():
    with pytest.raises(ValueError, match="unknown rollout correction .tis_typo.; valid names: mis_seq, mis_token"):
        MismatchGuard(action="fix", correction="tis_typo")
