"""ReferenceSync: move the reference model toward the policy during training (TR-DPO style).

TR-DPO (Gorbatovski et al. 2024, "Learn Your Reference Model for Real Good Alignment") updates
the reference instead of freezing it, so the KL term anchors the policy to a recent version of
itself rather than to the initial model:

    hard (every N optimizer steps):  ref <- policy
    soft (after every optimizer step):  ref <- alpha * policy + (1 - alpha) * ref

It needs a reference that is a separate copy (``GRPOModule`` with ``beta > 0`` or
``algorithm.kl_in_reward.coef`` and no LoRA, or ``policy.reference: copy``); the reference weights are part of the
module's checkpoint. The number of syncs is logged as ``reference/syncs``.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from ..training.module import GRPOModule


class ReferenceSync(Callback):
    """Hard (``every``) or soft (``alpha``) updates of the reference toward the policy.

    Args:
        every: copy the policy into the reference every this many optimizer steps.
        alpha: after every optimizer step, ``ref = alpha * policy + (1 - alpha) * ref`` (0 < alpha <= 1).
    """

    def __init__(self, every: int | None = None, alpha: float | None = None) -> None:
        if (every is None) == (alpha is None):
            raise ValueError("ReferenceSync needs exactly one of every (hard sync) and alpha (moving average)")
        if every is not None and every < 1:
            raise ValueError(f"ReferenceSync.every must be >= 1, got {every}")
        if alpha is not None and not 0 < alpha <= 1:
            raise ValueError(f"ReferenceSync.alpha must be in (0, 1], got {alpha}")
        self.every, self.alpha = every, alpha
        self.syncs = 0
        self._seen_step = -1

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        mode = pl_module.reference_mode if isinstance(pl_module, GRPOModule) else None
        if mode != "copy":
            raise ValueError(
                "ReferenceSync needs a reference model that is a separate copy of the policy (GRPOModule with "
                "loss beta > 0 or model.algorithm.kl_in_reward.coef and no LoRA, or model.policy.reference: copy); got reference mode "
                f"{mode!r}"
            )

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step  # optimizer steps so far: act once after each
        if step == self._seen_step or step == 0:
            return
        self._seen_step = step
        if self.every is not None and step % self.every != 0:
            return
        with torch.no_grad():
            for ref, policy in zip(pl_module.reference.parameters(), pl_module.policy.parameters()):
                if self.alpha is None:
                    ref.copy_(policy)
                else:
                    ref.lerp_(policy.to(ref.dtype), self.alpha)
        self.syncs += 1
        pl_module.log("reference/syncs", float(self.syncs), on_step=True, on_epoch=False, batch_size=1)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"syncs": self.syncs}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.syncs = int(state_dict["syncs"])
