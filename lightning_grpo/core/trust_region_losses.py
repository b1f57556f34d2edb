"""Policy losses that keep the update near the sampling policy by other means than PPO's ratio clip.

A soft gate on the ratio (SAPO) or a trust region on the sampled token's probability (DPPO);
registry ``POLICY_LOSSES``, verl names. Same interface as :mod:`.policy_losses`: ``fn(logp,
old_logp, advantages, mask, *, generator, **params) -> PolicyLossOutput(loss [B, T], metrics)``.
With ``r_t = exp(clamp(logp - old, +-20))``, ``p = exp(logp)``, ``p_old = exp(old)`` and the
advantage ``A`` ([B] or [B, T]):

    sapo      L_t = -(4 / tau) sigmoid(tau (r_t - 1)) A,  tau = tau_pos if A > 0 else tau_neg
    dppo_tv   L_t = -A sg[min(r_t, c)] logp_t valid_t,    valid_t: p - p_old <= delta_high (A > 0),
                                                           p - p_old >= -delta_low (A <= 0)
    dppo_kl   as dppo_tv with valid_t: binary KL(p_old || p) <= delta, or p moved the safe way

Aggregation: ``sapo`` names seq_mean_token_mean as its default (its spec's ``default_aggregation``: verl
always aggregates it so; ``GRPOLoss`` uses it when no aggregation is named, another can be named).

Departures from verl (``core_algos.py``), all deliberate:
- DPPO's trust-region sizes are ``delta_low`` / ``delta_high`` (verl reads ``clip_ratio_low`` /
  ``clip_ratio_high``, same meaning).
- DPPO's ``clip_ratio_c`` defaults to 20 (the paper's advice); verl's ``ActorConfig`` default is
  3.0 (its code's 20.0 is only a fallback for a config without the key).
- The log-ratio is clamped to +-20 in every loss; DPPO's p uses the unclamped log-prob as verl does.

Metrics (detached float32 scalars): ``ratio_min/mean/max``; sapo: ``gate_weight_mean`` /
``gate_weight_min`` (the gate's gradient scale 4 sigma (1 - sigma), 1 at r = 1, falling to 0 where
PPO would clip) and ``gate_frac_below_half`` (tokens whose scale < 0.5); dppo: ``clip_frac_high`` /
``clip_frac_low`` (A > 0 / A < 0 tokens outside the trust region; their sum is verl's
``pg_clipfrac`` except for A = 0 tokens outside the region, which verl counts and which have no
loss) and ``clip_frac_dual`` (tokens inside the trust region whose r > c, i.e. whose weight was
truncated; verl's ``pg_clipfrac_lower``, over all valid tokens).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .logprobs import masked_mean
from .ratios import (
    LossInputs,
    PolicyLossOutput,
    loss_output,
    prepare_inputs,
    ratio_metrics,
    token_ratio,
    valid_fraction,
)
from .registry import POLICY_LOSSES
from .specs import PolicyLossSpec

__all__ = ["sapo_loss", "dppo_tv_loss", "dppo_kl_loss"]


@POLICY_LOSSES.register("sapo", spec=PolicyLossSpec(default_aggregation="seq_mean_token_mean"))
def sapo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    generator: torch.Generator | None = None,
) -> PolicyLossOutput:
    """SAPO, soft adaptive policy optimisation (Qwen, arXiv 2511.20347; verl / TRL ``sapo``).

    L_t = -(4 / tau) sigmoid(tau (r_t - 1)) A_t, tau = tau_pos where A > 0, tau_neg otherwise
    (defaults 1.0 / 1.05, the paper's and verl's). A smooth gate instead of a hard clip: the
    gradient d L / d logp = -A r 4 sigma (1 - sigma) equals PPO's (-A) at r = 1 and fades as r
    leaves 1. Shapes as ``ppo_loss``. Default aggregation seq_mean_token_mean (as verl).
    """
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"tau_pos and tau_neg must be > 0, got {tau_pos}, {tau_neg}")
    x = prepare_inputs(logp, old_logp, advantages, mask)
    ratio = token_ratio(x)
    tau = torch.where(x.adv > 0, x.adv.new_tensor(tau_pos), x.adv.new_tensor(tau_neg))  # [B, T] in the loss dtype
    gate = torch.sigmoid(tau * (ratio - 1.0))  # [B, T]
    loss = -(4.0 / tau) * gate * x.adv
    weight = (4.0 * gate * (1.0 - gate)).detach()  # gradient scale relative to the unclipped surrogate at r
    metrics = ratio_metrics(ratio, x.valid)
    inf = torch.tensor(float("inf"), device=weight.device)
    metrics["gate_weight_mean"] = masked_mean(weight, x.valid).detach()
    metrics["gate_weight_min"] = torch.where(x.valid.any(), torch.where(x.valid, weight, inf).amin(), 0.0)
    metrics["gate_frac_below_half"] = valid_fraction(weight < 0.5, x.valid)
    return loss_output(loss, x.valid, metrics)


def _dppo(x: LossInputs, valid_pos: Tensor, valid_neg: Tensor, clip_ratio_c: float) -> PolicyLossOutput:
    """Shared DPPO tail: L = -A sg[min(r, c)] logp on tokens inside the trust region (detached mask)."""
    ratio = token_ratio(x)
    inside = torch.where(x.adv > 0, valid_pos, valid_neg).detach()  # [B, T] bool
    loss = -x.adv * ratio.clamp(max=clip_ratio_c).detach() * x.logp * inside
    metrics = ratio_metrics(ratio, x.valid)
    metrics["clip_frac_high"] = valid_fraction((x.adv > 0) & ~inside, x.valid)
    metrics["clip_frac_low"] = valid_fraction((x.adv < 0) & ~inside, x.valid)
    metrics["clip_frac_dual"] = valid_fraction(
        (ratio.detach() > clip_ratio_c) & inside, x.valid
    )  # verl pg_clipfrac_lower
    return loss_output(loss, x.valid, metrics)


def _probs(x: LossInputs, old_logp: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(p, p_old, old) [B, T] float32, detached: the sampled token's probability now and before."""
    old = torch.where(x.valid, old_logp.detach().to(x.logp.dtype), torch.zeros((), dtype=x.logp.dtype))
    return torch.exp(x.logp.detach()), torch.exp(old), old


def _check_dppo(delta_low: float, delta_high: float, clip_ratio_c: float) -> None:
    if delta_low < 0 or delta_high < 0:
        raise ValueError(f"delta_low and delta_high must be >= 0, got {delta_low}, {delta_high}")
    if clip_ratio_c <= 0:
        raise ValueError(f"clip_ratio_c must be > 0, got {clip_ratio_c}")


@POLICY_LOSSES.register("dppo_tv")
def dppo_tv_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    delta_low: float = 0.15,
    delta_high: float = 0.15,
    clip_ratio_c: float = 20.0,
    generator: torch.Generator | None = None,
) -> PolicyLossOutput:
    """DPPO binary-TV (arXiv 2602.04879; verl ``dppo_tv``, prime-rl's default loss).

    A trust region on the sampled token's probability instead of the ratio: a token trains
    (L_t = -A sg[min(r_t, c)] logp_t) while p - p_old <= delta_high (A > 0) or
    p - p_old >= -delta_low (A <= 0), and gets no gradient once it left that region.
    delta 0.15 (verl's example). clip_ratio_c 20: the paper's advice of a large cap (its Section
    5.4) and the fallback in verl's code; verl itself reads ``actor.clip_ratio_c``, whose default is
    3.0 (``ActorConfig``, shared with dual-clip PPO), so a verl run truncates at 3 unless it is set.
    Shapes as ``ppo_loss``.
    """
    _check_dppo(delta_low, delta_high, clip_ratio_c)
    x = prepare_inputs(logp, old_logp, advantages, mask)
    p, p_old, _ = _probs(x, old_logp)
    return _dppo(x, p - p_old <= delta_high, p - p_old >= -delta_low, clip_ratio_c)


@POLICY_LOSSES.register("dppo_kl")
def dppo_kl_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    delta_low: float = 0.05,
    delta_high: float = 0.05,
    clip_ratio_c: float = 20.0,
    generator: torch.Generator | None = None,
) -> PolicyLossOutput:
    """DPPO binary-KL (arXiv 2602.04879; verl ``dppo_kl``).

    D_t = p_old (old - logp) + (1 - p_old) log((1 - p_old + 1e-8) / (1 - p + 1e-8)), the KL between
    the Bernoulli distributions "sampled token or not" before and now. A token trains while
    D_t <= delta_high or p <= p_old (A > 0), D_t <= delta_low or p >= p_old (A <= 0); loss as
    ``dppo_tv``. delta 0.05 (verl's example); clip_ratio_c 20 as ``dppo_tv`` (verl's default: 3.0).
    Shapes as ``ppo_loss``.
    """
    _check_dppo(delta_low, delta_high, clip_ratio_c)
    x = prepare_inputs(logp, old_logp, advantages, mask)
    p, p_old, old = _probs(x, old_logp)
    kl = p_old * (old - x.logp.detach()) + (1.0 - p_old) * torch.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))
    return _dppo(x, (kl <= delta_high) | (p <= p_old), (kl <= delta_low) | (p >= p_old), clip_ratio_c)
