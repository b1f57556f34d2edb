"""ReferenceSync (TR-DPO): hard copies every N optimizer steps, or a moving average with alpha."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lightning_grpo import (
    GRPOLoss,
    GRPOModule,
    KLSettings,
    PromptDataModule,
    ReferenceSync,
    RewardSpec,
    RolloutCallback,
    SamplingConfig,
)
from lightning_grpo.data.tasks import DigitTask


def _module(path):
    from transformers import AutoModelForCausalLM

    return GRPOModule(
        model=AutoModelForCausalLM.from_pretrained(path),
        loss=GRPOLoss(kl=KLSettings(beta=0.1)),
        optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
    )


class Snapshots(L.Callback):
    """The policy's and the reference's weights at the start of each optimizer step."""

    def __init__(self):
        self.policy, self.reference = [], []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.policy.append([p.detach().clone() for p in pl_module.policy.parameters()])
        self.reference.append([p.detach().clone() for p in pl_module.reference.parameters()])


def _fit(module, sync, steps):
    snaps = Snapshots()
    rollout = RolloutCallback(
        engine="hf", sampling=SamplingConfig(n=4, max_new_tokens=2), rewards=[RewardSpec("prefix_match")], seed=3
    )
    L.seed_everything(0)
    trainer = L.Trainer(
        max_steps=steps,
        callbacks=[rollout, snaps, sync],
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(module, datamodule=PromptDataModule(DigitTask(), batch_size=4))
    return snaps


def _equal(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def test_hard_sync_copies_the_policy_every_n_steps(tiny_model_path):
    module = _module(tiny_model_path)
    sync = ReferenceSync(every=2)
    snaps = _fit(module, sync, steps=4)
    initial = snaps.reference[0]
    assert _equal(snaps.reference[1], initial)  # after step 1: not yet
    assert _equal(snaps.reference[2], snaps.policy[2]) and not _equal(snaps.reference[2], initial)  # after step 2
    assert _equal(snaps.reference[3], snaps.reference[2])
    final = [p.detach() for p in module.reference.parameters()]
    assert _equal(final, [p.detach() for p in module.policy.parameters()]) and sync.syncs == 2


def test_soft_sync_is_a_moving_average(tiny_model_path):
    module = _module(tiny_model_path)
    snaps = _fit(module, ReferenceSync(alpha=0.25), steps=3)
    for step in (1, 2):  # ref_k = 0.25 * policy_k + 0.75 * ref_{k-1}, policy_k = weights after step k
        for ref, prev, pol in zip(snaps.reference[step], snaps.reference[step - 1], snaps.policy[step]):
            torch.testing.assert_close(ref, 0.25 * pol + 0.75 * prev, atol=1e-7, rtol=1e-6)
    assert not _equal(snaps.reference[2], snaps.policy[2])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of every"),
        ({"every": 2, "alpha": 0.1}, "exactly one of every"),
        ({"every": 0}, "every must be >= 1"),
        ({"alpha": 1.5}, r"alpha must be in \(0, 1\]"),
    ],
)
def test_settings_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ReferenceSync(**kwargs)


def test_a_module_without_a_reference_copy_is_refused(tiny_model_path):
    from transformers import AutoModelForCausalLM

    module = GRPOModule(model=AutoModelForCausalLM.from_pretrained(tiny_model_path))  # beta 0: no reference
    with pytest.raises(
        ValueError, match="ReferenceSync needs a reference model that is a separate copy .* got reference mode 'none'"
    ):
        ReferenceSync(every=1).setup(None, module, "fit")
