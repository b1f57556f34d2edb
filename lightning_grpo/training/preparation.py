"""The rollout batch made ready for training: advantages from the rewards (with the KL to the reference moved
into the reward when ``algorithm.kl_in_reward`` says so) and, only where needed, the reference and old log-probs.

:class:`RolloutPreparationMixin` is part of :class:`~lightning_grpo.training.module.GRPOModule`; it reads the
module's settings (``algorithm``, ``loss_fn``), its models (``policy``, ``reference``), its distiller, its
advantage estimator and reward aggregation (``advantage_variant``, ``reward_aggregation_fn``) and its KL-in-reward
controller (``kl_ctrl``), all public members the module declares; it writes the last KL in reward and its
coefficient (``reward_kl``, ``reward_kl_coef``) for the module's step metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn

from ..core import KL_ESTIMATORS, GRPOLoss, masked_sum
from ..core.batch import RolloutBatch
from ..core.kl import kl_penalty_in_reward
from ..core.registry import Variant
from .settings import AlgorithmSettings


class RolloutPreparationMixin:
    """Advantages and the no-grad log-probs of a generation batch (see the module docstring)."""

    algorithm: AlgorithmSettings
    loss_fn: GRPOLoss
    policy: nn.Module | None
    reference: nn.Module | None
    distiller: Any
    kl_ctrl: Any
    reference_mode: str
    uses_reference: bool
    advantage_variant: Variant
    reward_aggregation_fn: Callable
    reward_kl: float
    reward_kl_coef: float

    def _logprobs_no_grad(self, batch: RolloutBatch, reference: bool) -> Tensor:
        model = self.policy if not reference or self.reference_mode == "adapter" else self.reference
        with self.policy.disable_adapter() if reference and self.reference_mode == "adapter" else nullcontext():
            return self.forward_logprobs(model, batch)

    # ----------------------------------------------------------------------- advantages
    def compute_advantages(
        self,
        rewards: Tensor,
        weights: Tensor,
        group_size: int,
        lengths: Tensor | None = None,
        scored: Tensor | None = None,
    ) -> Tensor:
        """rewards [B, R] (one column per reward function), weights [R] -> advantages [B]. ``lengths``
        [B] (completion tokens) go to an estimator whose spec says ``needs_lengths`` (opo). ``scored`` [B] bool:
        the rows some reward function scored (None: all); with ``algorithm.unscored: exclude`` the others
        are left out of the group statistics and get 0."""
        params = dict(self.algorithm.advantage_args or {})
        if self.advantage_variant.spec.needs_lengths:
            params["lengths"] = lengths
        if self.algorithm.unscored == "exclude" and scored is not None and not bool(scored.all()):
            params["scored"] = scored
        return self.reward_aggregation_fn(rewards, weights, group_size, estimator=self.algorithm.advantage, **params)

    def prepare_rollout_batch(
        self,
        batch: RolloutBatch,
        rewards: Tensor,
        weights: Tensor,
        records: list[dict] | None = None,
        scored: Tensor | None = None,
    ) -> RolloutBatch:
        """A new batch: ``batch`` with its advantages and, only where needed, the reference and old log-probs
        (``batch`` itself is left as it was).

        Old log-probs only when the batch is reused after an optimizer step (num_iterations or
        steps_per_generation > 1), or the loss needs them before its micro-batches run (rejection's
        ``keep_mask`` leaves the global normaliser; batch-normalised IS weights' step-wide mean);
        else old = sg[logp]. Never in bypass mode: old is the engine's. With distillation the
        teachers score the batch and the advantages become token-level (``records``: one per group). No-grad
        forwards run ``forward.rows_per_pass`` rows at a time. ``scored`` [B] bool: the rows some reward
        function scored (None: all), for `compute_advantages`.
        """
        if self.uses_reference:
            batch = replace(batch, ref_logp=self._logprobs_no_grad(batch, reference=True))
        if self.algorithm.kl_in_reward.coef:
            rewards, weights = self._kl_in_reward(batch, rewards @ weights), weights.new_ones(1)
        lengths = batch.completion_mask.sum(-1)  # [B]
        batch = replace(batch, advantages=self.compute_advantages(rewards, weights, batch.group_size, lengths, scored))
        if self.distiller is not None:
            batch = self.distiller.prepare(batch, records)
        reused = self.algorithm.num_iterations > 1 or self.algorithm.steps_per_generation > 1
        if not self.loss_fn.bypass and (reused or self.loss_fn.needs_old_before_training):
            batch = replace(batch, old_logp=self._logprobs_no_grad(batch, reference=False))
        if self.loss_fn.masks_before_training:
            mask = self.loss_fn.static_keep_mask(batch.old_logp, batch.rollout_logp, batch.completion_mask)
            batch = replace(batch, keep_mask=mask)
        return batch

    def _kl_in_reward(self, batch: RolloutBatch, total: Tensor) -> Tensor:
        """[B, 1] ``total - kl_ctrl.value * sum_t k1_t`` (k1 of the behaviour policy, ``rollout_logp``, to the reference),
        then the controller's update from the batch's KL, as verl's ``apply_kl_penalty``: the mean over all ranks'
        completions of each one's token-mean k1, ``n_steps`` = those completions."""
        mask = batch.completion_mask
        self.reward_kl_coef = self.kl_ctrl.value
        shaped = kl_penalty_in_reward(total, batch.rollout_logp, batch.ref_logp, mask, self.reward_kl_coef)
        kl = KL_ESTIMATORS.get("k1")(batch.rollout_logp, batch.ref_logp)  # [B, T]
        per_row = masked_sum(kl, mask, dim=-1) / mask.sum(-1).clamp(min=1)  # [B] token mean per completion
        kl_sum, rows = self._global_sum(torch.stack([per_row.sum(), per_row.new_tensor(float(len(per_row)))]))
        self.reward_kl = float(kl_sum / rows)
        self.kl_ctrl.update(self.reward_kl, int(rows))
        return shaped.unsqueeze(-1)
