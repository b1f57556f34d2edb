"""SFTModule: supervised fine-tuning of the policy, the warm start before GRPO (docs/guide/sft.md).

The policy is built exactly as `GRPOModule` builds it
(`PolicyMixin`: model path / ``nn.Module`` / the built-in tiny
model, ``policy`` settings: dtype, LoRA, QLoRA, gradient checkpointing; optimizer), and a checkpoint stores the same export
information, so ``lightning-grpo export runs/<sft run>`` writes the folder a GRPO recipe takes as
``model.model``.

The loss is the token mean of the cross-entropy over the assistant tokens (``loss_mask``, from
`SFTDataModule`) of a training step's batch, over all ranks::

    loss = - sum_{b, t} mask[b, t] * log p(x[b, t] | x[b, <t]) / sum_{b, t} mask[b, t]

(``mask`` is 1 on assistant tokens unless ``SFTFormatSettings(last_turn_weight=w)`` gives the last assistant
turn's tokens weight ``w``: then a weighted token mean.)

With ``accumulate_grad_batches`` > 1 each micro-batch is such a token mean and Lightning averages them
(TRL's per-device mean, not one token mean over the optimizer step). The token log-probs come from the
same forward layouts as GRPO's (`lightning_grpo.training.packing`): a batch is a
`RolloutBatch` whose "prompt" is its first token and whose
"completion" is the rest, so ``forward.packing`` (padding-free rows) and ``forward.logprob_path: chunked_hidden``
(the full logits never exist) apply unchanged.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from ..core import LOGPROBS
from ..core.batch import RolloutBatch, position_ids
from .forward import layout_token_logprobs
from .metrics import hands_step_metrics_over, total_grad_norm
from .policy import PolicyMixin
from .settings import ForwardSettings, SFTForwardSettings, SFTPolicySettings, as_settings, settings_dict


class SFTModule(PolicyMixin, L.LightningModule):
    """Supervised fine-tuning on assistant tokens, with GRPOModule's policy building.

    Args:
        model: a Hugging Face model directory / hub name, an ``nn.Module``, a checkpoint / run folder
            (`lightning_grpo.models.checkpoint_source`), or ``"tiny:<variant>[@<seed>]"`` (the built-in
            tiny model, initialised from the run's seed unless pinned). Required.
        policy: dtype, LoRA, QLoRA and gradient checkpointing (`SFTPolicySettings`: no reference model).
        forward: the log-prob path, its chunking and packing (`SFTForwardSettings`: SFT rows share no
            prompt and have no no-grad pass).
        optimizer: a LightningCLI-style callable taking the parameters.
        lr_scheduler: a LightningCLI-style callable taking the optimizer, or None.

    Example:
        ```python
        import lightning as L
        from lightning_grpo import SFTDataModule, SFTModule

        module = SFTModule(model="Qwen/Qwen2.5-0.5B-Instruct")
        data = SFTDataModule(train_files="transcripts.jsonl", tokenizer_path="Qwen/Qwen2.5-0.5B-Instruct")
        L.Trainer(max_steps=300).fit(module, datamodule=data)
        ```
    """

    def __init__(
        self,
        model: str | nn.Module,
        policy: SFTPolicySettings = SFTPolicySettings(),  # noqa: B008 - a settings value shown by --help, read and never mutated
        forward: SFTForwardSettings = SFTForwardSettings(),  # noqa: B008 - a settings value shown by --help, read and never mutated
        optimizer: OptimizerCallable = torch.optim.AdamW,
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__()
        self.policy_settings = as_settings(SFTPolicySettings, policy)
        self.forward_settings = as_settings(SFTForwardSettings, forward)
        self.save_hyperparameters(
            {"policy": settings_dict(self.policy_settings), "forward": settings_dict(self.forward_settings)}
        )
        self._init_policy(model, self.policy_settings, optimizer, lr_scheduler)
        self._layout = ForwardSettings(**settings_dict(self.forward_settings), prefix_sharing="off")  # no shared prompt
        self._val_sums: Tensor | None = None  # [4] loss sum, tokens, right tokens, right rows / rows (see validation)

    def configure_model(self) -> None:
        if self.device_mesh is not None:
            raise NotImplementedError(
                "SFTModule does not shard with FSDP2 (ModelParallelStrategy): use strategy ddp or one device"
            )
        self._build_policy()

    # ----------------------------------------------------------------------------- loss
    @staticmethod
    def as_rollout_batch(batch: dict[str, Tensor]) -> RolloutBatch:
        """The batch as GRPO's forward layouts take it: "prompt" = the tokens before the batch's first
        assistant token (none of them is padding: rows are right-padded and each is longer than its first
        assistant token), "completion" = the rest, so the LM head never runs on a shared system prompt (with a
        151k-token vocabulary it is most of the step)."""
        ids, attention, mask = batch["input_ids"], batch["attention_mask"], batch["loss_mask"]  # [B, L] each
        hit = mask[:, 1:].any(0).nonzero()
        start = (
            1 + int(hit[0]) if len(hit) else 1
        )  # the first position any row trains on (>= 1: token 0 has no context)
        targets = mask[:, start:].float()  # [B, L-start] the tokens that enter the loss
        zeros = torch.zeros_like(targets)
        turns = torch.where(targets > 0, 0, -1)  # [B, L-start] other turns (a tool result) are context: no LM head
        return RolloutBatch(
            ids,
            attention,
            targets,
            zeros[:, 0],
            zeros,
            prompt_length=start,
            group_size=1,
            temperature=1.0,
            turn_ids=turns,
        )

    def token_logprobs(self, batch: RolloutBatch) -> Tensor:
        """[B, Lc] log-probs of the completion tokens of each row, packed or padded as ``packing`` says."""
        return layout_token_logprobs(self.policy, batch, self._layout).logp

    def sft_loss(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """(the loss this rank contributes, the assistant tokens of all ranks): the ranks' losses sum to
        the (weighted) token-mean cross-entropy over every rank's assistant tokens."""
        rollout = self.as_rollout_batch(batch)
        logp = self.token_logprobs(rollout)  # [B, L-1]
        weights = rollout.completion_mask  # [B, L-1] each token's loss weight (1 on assistant tokens by default)
        totals = self._global_sum(
            torch.stack([weights.sum(), (weights > 0).sum().to(weights.dtype)])
        )  # [2] weight, tokens
        return -(logp * weights).sum() / totals[0].clamp(min=1e-8), totals[1]

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss, tokens = self.sft_loss(batch)
        world = self.trainer.world_size
        logged = self._global_sum(loss.detach()) if world > 1 else loss.detach()
        if hands_step_metrics_over(self.trainer):
            self.log_dict(
                {"train/loss": logged, "train/tokens": tokens},
                batch_size=len(batch["input_ids"]),
                on_step=True,
                on_epoch=False,
            )
        self.log("loss", logged, prog_bar=True, logger=False, on_step=True, on_epoch=False)
        return loss * world  # DDP averages the ranks' gradients: undo it, the loss is normalised globally

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if not hands_step_metrics_over(self.trainer):
            return
        self.log(
            "train/grad_norm",
            float(total_grad_norm(self.policy.parameters())),
            batch_size=1,
            on_step=True,
            on_epoch=False,
        )

    # ----------------------------------------------------------------------- validation
    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        """Summed over the validation set: the loss and greedy accuracies on the assistant tokens."""
        ids, mask = batch["input_ids"], batch["loss_mask"][:, 1:].bool()  # [B, L], [B, L-1]
        targets = ids[:, 1:][mask]  # [N] the assistant tokens
        nll, right = [], []
        for logits, chunk in self._assistant_logits(batch, mask):  # [n, V] predicting targets[chunk]
            logits = logits.float()
            nll.append(-torch.log_softmax(logits, -1).gather(-1, targets[chunk, None]).squeeze(-1))  # [n]
            right.append(logits.argmax(-1) == targets[chunk])  # [n]
        nll, right = torch.cat(nll), torch.cat(right)  # [N] each
        wrong_rows = torch.zeros(len(ids), device=ids.device).index_add_(
            0, mask.nonzero()[:, 0], (~right).float()
        )  # [B]
        rows_right = (wrong_rows == 0).float().sum()  # every assistant token of the row right
        sums = torch.stack(
            [nll.sum(), nll.new_tensor(len(nll)), right.float().sum(), rows_right, nll.new_tensor(len(ids))]
        )
        self._val_sums = sums if self._val_sums is None else self._val_sums + sums

    def _assistant_logits(self, batch: dict[str, Tensor], mask: Tensor):
        """``(logits [n, V], slice)`` of the assistant tokens, a chunk at a time: the decoder once, then the LM
        head on the assistant positions only (``forward.logprob_path: logits``, or a model without a decoder / LM
        head: the model's own logits)."""
        model, attention = self.policy, batch["attention_mask"]
        kwargs = dict(input_ids=batch["input_ids"], attention_mask=attention, position_ids=position_ids(attention))
        chunked = LOGPROBS.spec(self.forward_settings.logprob_path).reads == "hidden"
        # a transformers model (third-party)
        if not (chunked and hasattr(model, "get_decoder") and hasattr(model, "get_output_embeddings")):
            yield model(**kwargs).logits[:, :-1][mask], slice(None)  # [N, V]
            return
        hidden = model.get_decoder()(**kwargs, use_cache=False).last_hidden_state[:, :-1][mask]  # [N, H]
        head, size = model.get_output_embeddings(), self.forward_settings.chunk_size
        for start in range(0, len(hidden), size):
            yield head(hidden[start : start + size]), slice(start, start + size)

    def on_validation_epoch_end(self) -> None:
        self._log_sums("val")

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        """The validation metrics on the test split (``test/*``; ``lightning-grpo sft test --ckpt_path ...``)."""
        self.validation_step(batch, batch_idx)

    def on_test_epoch_end(self) -> None:
        self._log_sums("test")

    def _log_sums(self, split: str) -> None:
        if self._val_sums is None:
            return
        loss, tokens, right, rows_right, rows = self._global_sum(self._val_sums).tolist()
        self._val_sums = None
        metrics = {
            "loss": loss / max(tokens, 1),
            "token_accuracy": right / max(tokens, 1),
            "accuracy": rows_right / max(rows, 1),
        }
        self.log_dict({f"{split}/{k}": v for k, v in metrics.items()}, batch_size=1, on_step=False, on_epoch=True)

    # -------------------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._save_export_info(checkpoint)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._load_quant_state(checkpoint)
