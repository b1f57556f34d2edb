"""The grouped settings of `GRPOLoss`: the KL term, the
off-policy handling (correction, rejection, bypass, sequence mask) and the extra per-token terms.

A recipe writes them as sections of ``model.loss.init_args``::

    loss:
      class_path: lightning_grpo.GRPOLoss
      init_args:
        policy_loss: ppo
        kl: {beta: 0.04, estimator: k3}
        off_policy: {correction: tis_token, correction_args: {cap: 2.0}}
        terms: {entropy_coef: 0.001}

The settings are frozen: the loss holds the current ones, and what moves during training (the
entropy coefficient, through ``GRPOLoss.set_knob``; the correction, through
``GRPOLoss.set_correction``) is replaced there, never written into a settings object.
Names are checked against the registries when the loss is built; the ranges are checked here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .rejection import Threshold

__all__ = ["KLSettings", "LossTerms", "OffPolicySettings"]


@dataclass(frozen=True)
class KLSettings:
    """The KL-to-reference term of the loss: ``+ beta * KL_t(logp, ref)`` per token."""

    beta: float = 0.0
    """KL coefficient, >= 0; 0 disables the term and the reference model (GRPO: 0.04)."""
    estimator: str = "k3"
    """Name in ``KL_ESTIMATORS``: k1, k2, k3, low_var_kl, k3_unbiased, or a straight-through ``+``
    variant (k1+, k3+, low_var_kl+)."""

    def __post_init__(self) -> None:
        if not (self.beta >= 0 and math.isfinite(self.beta)):
            raise ValueError(f"kl.beta must be a finite number >= 0 (0 = no KL term), got {self.beta!r}")


@dataclass(frozen=True)
class OffPolicySettings:
    """How the loss treats the gap between the policy being trained and the one that sampled (the
    rollout engine's log-probs): a correction weight, rejection, bypass mode, a sequence mask."""

    correction: str | None = None
    """Name in ``CORRECTIONS`` (tis_token, tis_seq, mis_token, mis_seq, ...) or None: weights each
    token's loss by the trainer / engine probability ratio (truncated or masked)."""
    correction_args: dict[str, Any] | None = None
    """Keyword arguments of the correction (``{cap: 2.0}``, ``{low: 0.5, high: 2.0}``)."""
    is_batch_normalize: bool = False
    """Divide the correction's weights by their mean (verl ``rollout_is_batch_normalize``): over the
    valid tokens (token-level) or non-empty rows (sequence-level), zeros included, of the whole
    optimizer-step batch."""
    rejection: dict[str, Threshold] | None = None
    """Rejection criteria (``REJECTIONS``) and their thresholds, all applied (verl ``rollout_rs``):
    e.g. ``{token_k1: [0.5, 2.0], seq_mean_k3: 0.01, outlier_veto: null}``; None = off."""
    bypass: bool = False
    """Old log-probs := the engine's (verl ``bypass_mode``): no trainer pass computes them, the ratio is
    pi / pi_roll; ``correction`` must then be None (policy_loss ``reinforce`` is the truncated-IS form)."""
    sequence_mask_delta: float | None = None
    """DeepSeek-V3.2 off-policy sequence mask: drop a negative-advantage row whose mean
    log-prob drift from the engine exceeds this threshold; None = off."""

    def __post_init__(self) -> None:
        if self.bypass and self.correction is not None:
            raise ValueError(
                f"off_policy.bypass=True uses the engine's log-probs as old, so the ratio already is pi / pi_roll: "
                f"off_policy.correction must be None, got {self.correction!r} (policy_loss 'reinforce' is the truncated-IS form)"
            )


@dataclass(frozen=True)
class LossTerms:
    """Extra per-token terms and masks added to the policy loss."""

    entropy_coef: float = 0.0
    """Weight of the entropy bonus ``- entropy_coef * H_t`` (0 = off); a knob EntropyController may move."""
    llds_coef: float = 0.0
    """Weight of the LLDS likelihood-preserving regulariser, gated per model turn (0 = off)."""
    negative_advantage_scale: float = 1.0
    """Multiplies negative advantages before the loss (1.0 = unchanged, 0 = learn from positives only)."""
    top_entropy_quantile: float | None = None
    """Train only on tokens whose entropy is at or above this quantile of the batch's valid tokens, in
    [0, 1) (0.8 keeps the top 20%); None = every token."""

    def __post_init__(self) -> None:
        q = self.top_entropy_quantile
        if q is not None and not 0.0 <= q < 1.0:
            raise ValueError(f"terms.top_entropy_quantile must be in [0, 1) (0.8 keeps the top 20%) or null, got {q!r}")
