"""Policy losses of the 2025-2026 frontier (registry ``POLICY_LOSSES``, verl 0.9 names).

Same interface as :mod:`.policy_losses`: ``fn(logp, old_logp, advantages, mask, *, generator,
**params) -> PolicyLossOutput(loss [B, T], metrics)``. With ``r_t = exp(clamp(logp - old, +-20))``,
``p = exp(logp)``, ``p_old = exp(old)`` and the advantage ``A`` ([B] or [B, T]):

    sapo      L_t = -(4 / tau) sigmoid(tau (r_t - 1)) A,  tau = tau_pos if A > 0 else tau_neg
    dppo_tv   L_t = -A sg[min(r_t, c)] logp_t valid_t,    valid_t: p - p_old <= delta_high (A > 0),
                                                           p - p_old >= -delta_low (A <= 0)
    dppo_kl   as dppo_tv with valid_t: binary KL(p_old || p) <= delta, or p moved the safe way
    dro       L_t = -(logp_t A - (beta / 2) (logp_t - old_t)^2)
    geo_mean  l_t = sign(A) min(sign(A) (logp - old), sign(A) clamp(logp - old, -eps_low, eps_high)),
              s_i = exp(sum_t l_t / |o_i|), L_i = -mean_t(A) s_i            (GMPO, per sequence)
    gpg       L_t = -A logp_t                                              (no ratio, no clip)
    reinforce L_t = -sg[min(r_t, cap)] A logp_t                            (bypass-mode REINFORCE)

Aggregation: ``sapo`` names seq_mean_token_mean as its default (``default_aggregation``: verl
always aggregates it so; ``GRPOLoss`` uses it when no aggregation is named, another can be named).
``geo_mean`` puts its per-sequence loss L_i on every valid token of row i, so seq_mean_token_mean is
exactly GMPO's ``mean_i(L_i)``; it declares ``required_aggregation`` and ``GRPOLoss`` refuses any other.
With a rollout correction, ``GRPOLoss`` scales row i by the geometric mean of its token IS weights,
``exp(mean_t log(w_t + 1e-10))`` (``sequence_is_weight``, as verl's geo_mean), not by their
arithmetic mean (weights [2, 0.5]: 1, not 1.25).

Departures from verl (``core_algos.py``), all deliberate:
- Parameter names: DPPO's trust-region sizes are ``delta_low`` / ``delta_high`` (verl reads
  ``clip_ratio_low`` / ``clip_ratio_high``, same meaning); DRO's is ``beta`` (verl ``dro_beta``),
  required and > 0; GMPO's clip is ``eps_low`` / ``eps_high`` in log space, default 0.4 (the
  paper's; verl reuses the PPO ``clip_ratio``, 0.2).
- DPPO's ``clip_ratio_c`` defaults to 20 (the paper's advice); verl's ``ActorConfig`` default is
  3.0 (its code's 20.0 is only a fallback for a config without the key).
- The log-ratio is clamped to +-20 in every loss, also geo_mean's mean log-ratio (verl leaves
  geo_mean unclamped); DPPO's p uses the unclamped log-prob as verl does.
- geo_mean's clip fractions count tokens where the clamp is *active* (it blocks the gradient on
  the side of sign(A)); verl counts every token outside the band.
- ``reinforce`` is verl's ``compute_policy_loss_reinforce`` with its truncated IS weight computed
  from ``old`` (with ``GRPOLoss(bypass=True)``, old = the engine's log-probs, so w = pi / pi_roll
  as in verl's bypass mode). It equals ``cispo`` with ``eps_low=None, eps_high=cap - 1``.

Metrics (detached float32 scalars): ``ratio_min/mean/max`` for all but gpg; sapo:
``gate_weight_mean`` / ``gate_weight_min`` (the gate's gradient scale 4 sigma (1 - sigma), 1 at
r = 1, falling to 0 where PPO would clip) and ``gate_frac_below_half`` (tokens whose scale < 0.5);
dppo: ``clip_frac_high`` / ``clip_frac_low`` (A > 0 / A < 0 tokens outside the trust region; their
sum is verl's ``pg_clipfrac`` except for A = 0 tokens outside the region, which verl counts and
which have no loss) and ``clip_frac_dual`` (tokens inside the trust region whose r > c, i.e. whose
weight was truncated; verl's ``pg_clipfrac_lower``, over all valid tokens); geo_mean:
``clip_frac_high`` / ``clip_frac_low``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .guards import clamp_log_ratio
from .logprobs import masked_mean
from .policy_losses import PolicyLossOutput, _check_eps, _frac, _Inputs, _output, _prepare, _ratio_metrics, cispo_loss
from .registry import POLICY_LOSSES

__all__ = ["sapo_loss", "dppo_tv_loss", "dppo_kl_loss", "dro_loss", "geo_mean_loss", "gpg_loss", "reinforce_loss"]


def _ratio(x: _Inputs) -> Tensor:
    return torch.exp(clamp_log_ratio(x.log_ratio))  # [B, T]


@POLICY_LOSSES.register("sapo")
def sapo_loss(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *,
    tau_pos: float = 1.0, tau_neg: float = 1.05, generator: torch.Generator | None = None,
) -> PolicyLossOutput:
    """SAPO, soft adaptive policy optimisation (Qwen, arXiv 2511.20347; verl / TRL ``sapo``).

    L_t = -(4 / tau) sigmoid(tau (r_t - 1)) A_t, tau = tau_pos where A > 0, tau_neg otherwise
    (defaults 1.0 / 1.05, the paper's and verl's). A smooth gate instead of a hard clip: the
    gradient d L / d logp = -A r 4 sigma (1 - sigma) equals PPO's (-A) at r = 1 and fades as r
    leaves 1. Shapes as ``ppo_loss``. Default aggregation seq_mean_token_mean (as verl).
    """
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"tau_pos and tau_neg must be > 0, got {tau_pos}, {tau_neg}")
    x = _prepare(logp, old_logp, advantages, mask)
    ratio = _ratio(x)
    tau = torch.where(x.adv > 0, x.adv.new_tensor(tau_pos), x.adv.new_tensor(tau_neg))  # [B, T] in the loss dtype
    gate = torch.sigmoid(tau * (ratio - 1.0))  # [B, T]
    loss = -(4.0 / tau) * gate * x.adv
    weight = (4.0 * gate * (1.0 - gate)).detach()  # gradient scale relative to the unclipped surrogate at r
    metrics = _ratio_metrics(ratio, x.valid)
    inf = torch.tensor(float("inf"), device=weight.device)
    metrics["gate_weight_mean"] = masked_mean(weight, x.valid).detach()
    metrics["gate_weight_min"] = torch.where(x.valid.any(), torch.where(x.valid, weight, inf).amin(), 0.0)
    metrics["gate_frac_below_half"] = _frac(weight < 0.5, x.valid)
    return _output(loss, x.valid, metrics)


sapo_loss.default_aggregation = "seq_mean_token_mean"


def _dppo(x: _Inputs, valid_pos: Tensor, valid_neg: Tensor, clip_ratio_c: float) -> PolicyLossOutput:
    """Shared DPPO tail: L = -A sg[min(r, c)] logp on tokens inside the trust region (detached mask)."""
    ratio = _ratio(x)
    inside = torch.where(x.adv > 0, valid_pos, valid_neg).detach()  # [B, T] bool
    loss = -x.adv * ratio.clamp(max=clip_ratio_c).detach() * x.logp * inside
    metrics = _ratio_metrics(ratio, x.valid)
    metrics["clip_frac_high"] = _frac((x.adv > 0) & ~inside, x.valid)
    metrics["clip_frac_low"] = _frac((x.adv < 0) & ~inside, x.valid)
    metrics["clip_frac_dual"] = _frac((ratio.detach() > clip_ratio_c) & inside, x.valid)  # verl pg_clipfrac_lower
    return _output(loss, x.valid, metrics)


def _probs(x: _Inputs, old_logp: Tensor) -> tuple[Tensor, Tensor, Tensor]:
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
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *,
    delta_low: float = 0.15, delta_high: float = 0.15, clip_ratio_c: float = 20.0,
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
    x = _prepare(logp, old_logp, advantages, mask)
    p, p_old, _ = _probs(x, old_logp)
    return _dppo(x, p - p_old <= delta_high, p - p_old >= -delta_low, clip_ratio_c)


@POLICY_LOSSES.register("dppo_kl")
def dppo_kl_loss(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *,
    delta_low: float = 0.05, delta_high: float = 0.05, clip_ratio_c: float = 20.0,
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
    x = _prepare(logp, old_logp, advantages, mask)
    p, p_old, old = _probs(x, old_logp)
    kl = p_old * (old - x.logp.detach()) + (1.0 - p_old) * torch.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))
    return _dppo(x, (kl <= delta_high) | (p <= p_old), (kl <= delta_low) | (p >= p_old), clip_ratio_c)


@POLICY_LOSSES.register("dro")
def dro_loss(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *,
    beta: float, generator: torch.Generator | None = None,
) -> PolicyLossOutput:
    """DRO / Kimi squared log-ratio (Kimi k1.5; verl ``dro`` with ``dro_beta``, ROLL ``kimi15``).

    L_t = -(logp_t A - (beta / 2) (logp_t - old_t)^2): the policy gradient plus a quadratic pull
    back toward the sampling policy. ``beta`` is required and > 0. Shapes as ``ppo_loss``.
    """
    if not beta > 0:
        raise ValueError(f"dro needs beta > 0 (the weight of the squared log-ratio), got {beta}")
    x = _prepare(logp, old_logp, advantages, mask)
    loss = -(x.logp * x.adv - 0.5 * beta * x.log_ratio.square())
    return _output(loss, x.valid, _ratio_metrics(_ratio(x), x.valid))


@POLICY_LOSSES.register("geo_mean")
def geo_mean_loss(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *,
    eps_low: float = 0.4, eps_high: float = 0.4, generator: torch.Generator | None = None,
) -> PolicyLossOutput:
    """GMPO, geometric-mean policy optimisation (arXiv 2507.20673; verl ``geo_mean``).

    Per token, the log-ratio is clipped in log space on the side of sign(A):
    l_t = sign(A) min(sign(A) d_t, sign(A) clamp(d_t, -eps_low, eps_high)), d_t = logp_t - old_t;
    s_i = exp(clamp(sum_t l_t / |o_i|, +-20)), A_i = mean_t A_t, L_i = -A_i s_i, written on every
    valid token of row i (seq_mean_token_mean, required, gives mean_i L_i). eps 0.4 (paper).
    """
    _check_eps(eps_low, eps_high)
    x = _prepare(logp, old_logp, advantages, mask)
    sign = torch.sign(x.adv)  # [B, T]
    clamped = x.log_ratio.clamp(-eps_low, eps_high)
    clipped = sign * torch.minimum(sign * x.log_ratio, sign * clamped)  # [B, T]
    s = torch.exp(clamp_log_ratio(masked_mean(clipped, x.valid, dim=-1)))  # [B]
    adv_seq = masked_mean(x.adv, x.valid, dim=-1)  # [B]
    loss = (-adv_seq * s).unsqueeze(-1).expand_as(x.logp)  # [B, T]
    active = (sign * clamped < sign * x.log_ratio).detach()  # the clamp blocks the gradient here
    metrics = _ratio_metrics(s.unsqueeze(-1).expand_as(x.logp), x.valid)
    metrics["clip_frac_high"] = _frac(active & (x.adv > 0), x.valid)
    metrics["clip_frac_low"] = _frac(active & (x.adv < 0), x.valid)
    return _output(loss, x.valid, metrics)


def _row_geometric_mean(weight: Tensor, mask: Tensor) -> Tensor:
    """GMPO's IS weight per row (verl): exp(mean_t log(w_t + 1e-10)) over the valid tokens of ``mask``,
    broadcast to them. weight, mask [B, T] -> [B, T] (0 on padding and on empty rows); detached."""
    m = mask.detach().float()
    log_w = torch.log(weight.detach().float() + 1e-10)  # [B, T]; a zero weight (MIS) counts as 1e-10
    return torch.exp(masked_mean(log_w, m, dim=-1, keepdim=True)) * m


geo_mean_loss.required_aggregation = "seq_mean_token_mean"
geo_mean_loss.sequence_is_weight = _row_geometric_mean


@POLICY_LOSSES.register("gpg")
def gpg_loss(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, generator: torch.Generator | None = None,
) -> PolicyLossOutput:
    """GPG, group policy gradient (verl ``gpg``): L_t = -A logp_t, no ratio and no clip.

    ``old_logp`` is unused except for shape checks. Pair it with the ``gpg`` advantage.
    Shapes as ``ppo_loss``; no metrics.
    """
    x = _prepare(logp, old_logp, advantages, mask)
    return _output(-x.adv * x.logp, x.valid, {})


@POLICY_LOSSES.register("reinforce")
def reinforce_loss(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *,
    cap: float = 2.0, generator: torch.Generator | None = None,
) -> PolicyLossOutput:
    """REINFORCE with a truncated importance weight (verl bypass mode, ``loss_type: reinforce``).

    L_t = -sg[min(r_t, cap)] A logp_t, r_t = exp(logp - old). With ``GRPOLoss(bypass=True)`` old
    is the engine's log-prob, so the weight is pi / pi_roll truncated at ``cap`` (verl
    ``rollout_is_threshold``, 2.0). The same numbers as ``cispo`` with eps_high = cap - 1 and no
    lower bound, which computes it. Shapes and metrics as ``cispo_loss``.
    """
    if not cap >= 1.0:
        raise ValueError(f"reinforce cap must be >= 1 (it truncates pi / pi_old from above), got {cap}")
    return cispo_loss(logp, old_logp, advantages, mask, eps_high=cap - 1.0, eps_low=None, generator=generator)
