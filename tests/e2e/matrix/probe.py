"""A callback the matrix adds to each cell's run: the trained policy's logits on a fixed input at the
end of training (every rank runs the forward: under FSDP2 it is a collective; rank 0 writes)."""

from __future__ import annotations

import os

import lightning as L
import torch

#: The fixed input (token ids of the tiny character vocabulary).
PROBE_IDS = [[5, 9, 7, 12, 3, 8, 14, 6]]


class LogitsProbe(L.Callback):
    def __init__(self, path: str) -> None:
        self.path = path

    @torch.no_grad()
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        policy = pl_module.policy
        was_training = policy.training
        policy.eval()  # no dropout (LoRA's)
        ids = torch.tensor(PROBE_IDS, device=pl_module.device)
        logits = policy(input_ids=ids).logits.float().cpu()  # [1, T, V]
        policy.train(was_training)
        if trainer.global_rank == 0:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            torch.save({"logits": logits, "step": trainer.global_step}, self.path)
