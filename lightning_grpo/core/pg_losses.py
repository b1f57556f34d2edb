"""Policy-gradient losses without a ratio clip: ``-A logp`` plain, with a truncated weight, or pulled back.

Registry ``POLICY_LOSSES``, verl names; same interface as :mod:`.policy_losses`. With
``r_t = exp(clamp(logp - old, +-20))`` and the advantage ``A`` ([B] or [B, T]):

    gpg       L_t = -A logp_t                                              (no ratio, no clip)
    reinforce L_t = -sg[min(r_t, cap)] A logp_t                            (bypass-mode REINFORCE)
    dro       L_t = -(logp_t A - (beta / 2) (logp_t - old_t)^2)

Departures from verl (``core_algos.py``), all deliberate:
- DRO's weight is ``beta`` (verl ``dro_beta``), required and > 0.
- ``reinforce`` is verl's ``compute_policy_loss_reinforce`` with its truncated IS weight computed
  from ``old`` (with ``OffPolicySettings(bypass=True)``, old = the engine's log-probs, so w = pi / pi_roll
  as in verl's bypass mode). It equals ``cispo`` with ``eps_low=None, eps_high=cap - 1``.

Metrics (detached float32 scalars): ``ratio_min/mean/max`` for dro and reinforce (as ``cispo``);
gpg has none.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .policy_losses import cispo_loss
from .ratios import PolicyLossOutput, loss_output, prepare_inputs, ratio_metrics, token_ratio
from .registry import POLICY_LOSSES

__all__ = ["gpg_loss", "reinforce_loss", "dro_loss"]


@POLICY_LOSSES.register("gpg")
def gpg_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    generator: torch.Generator | None = None,
) -> PolicyLossOutput:
    """GPG, group policy gradient (verl ``gpg``): L_t = -A logp_t, no ratio and no clip.

    ``old_logp`` is unused except for shape checks. Pair it with the ``gpg`` advantage.
    Shapes as ``ppo_loss``; no metrics.
    """
    x = prepare_inputs(logp, old_logp, advantages, mask)
    return loss_output(-x.adv * x.logp, x.valid, {})


@POLICY_LOSSES.register("reinforce")
def reinforce_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    cap: float = 2.0,
    generator: torch.Generator | None = None,
) -> PolicyLossOutput:
    """REINFORCE with a truncated importance weight (verl bypass mode, ``loss_type: reinforce``).

    L_t = -sg[min(r_t, cap)] A logp_t, r_t = exp(logp - old). With ``OffPolicySettings(bypass=True)`` old
    is the engine's log-prob, so the weight is pi / pi_roll truncated at ``cap`` (verl
    ``rollout_is_threshold``, 2.0). The same numbers as ``cispo`` with eps_high = cap - 1 and no
    lower bound, which computes it. Shapes and metrics as ``cispo_loss``.
    """
    if not cap >= 1.0:
        raise ValueError(f"reinforce cap must be >= 1 (it truncates pi / pi_old from above), got {cap}")
    return cispo_loss(logp, old_logp, advantages, mask, eps_high=cap - 1.0, eps_low=None, generator=generator)


@POLICY_LOSSES.register("dro")
def dro_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    beta: float,
    generator: torch.Generator | None = None,
) -> PolicyLossOutput:
    """DRO / Kimi squared log-ratio (Kimi k1.5; verl ``dro`` with ``dro_beta``, ROLL ``kimi15``).

    L_t = -(logp_t A - (beta / 2) (logp_t - old_t)^2): the policy gradient plus a quadratic pull
    back toward the sampling policy. ``beta`` is required and > 0. Shapes as ``ppo_loss``.
    """
    if not beta > 0:
        raise ValueError(f"dro needs beta > 0 (the weight of the squared log-ratio), got {beta}")
    x = prepare_inputs(logp, old_logp, advantages, mask)
    loss = -(x.logp * x.adv - 0.5 * beta * x.log_ratio.square())
    return loss_output(loss, x.valid, ratio_metrics(token_ratio(x), x.valid))
