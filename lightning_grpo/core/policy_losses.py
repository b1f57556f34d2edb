"""Per-token policy losses of the GRPO family (registry ``POLICY_LOSSES``).

Every loss maps ``(logp, old_logp, advantages, mask)`` to a per-token loss ``L [B, T]`` (0 on
masked tokens, before aggregation) and detached scalar metrics. With
``r_t = exp(clamp(logp_t - old_t, -20, 20))`` and the advantage ``A`` ([B] broadcast over tokens,
or [B, T]):

    ppo         L_t = -min(r_t A, clip(r_t, 1 - eps_low, 1 + eps_high) A)   (Clip-Higher: eps_high > eps_low)
    dual_clip   as ppo, then for A < 0: L_t = min(L_t, -A c)                    (verl clip_ratio_c)
    delta_clip  L_t = -min(min(r_t, delta) A, clip(r_t, ...) A)                  (TRL delta, INTELLECT-2)
    gspo        s_i = exp(mean_t(logp - old)); L_it = -min(s_i A_it, clip(s_i, ...) A_it)
    gspo_token  s_it = sg[s_i] * exp(logp_t - sg[logp_t]); same formula with s_it
    cispo       L_t = -sg[clip(r_t, 1 - eps_low, 1 + eps_high)] A logp_t      (no low clip by default)
    clip_cov    ppo, with a few random high-covariance tokens set to 0 (no gradient)
    kl_cov      L_t = -A r_t, plus ppo_kl_coef * |logp_t - old_t| on the top-k covariance tokens
    geo_mean    l_t = sign(A) min(sign(A) (logp - old), sign(A) clamp(logp - old, -eps_low, eps_high)),
                s_i = exp(sum_t l_t / |o_i|), L_i = -mean_t(A) s_i            (GMPO, per sequence)

All share one clipped-surrogate helper (``clipped_surrogate``, :mod:`.ratios`). Every loss takes ``generator``
(used only by clip_cov's random choice) so the caller can pass it uniformly.

Departures from the peers (verl ``core_algos.py``, TRL ``GRPOTrainer._compute_loss``):
- The log-ratio is clamped to +-20 before ``exp`` in every loss (verl does so for ppo/cispo but
  not clip_cov/kl_cov, and clamps GSPO's combined log-ratio at +10 only).
- GSPO's sequence log-ratio is the masked *mean* of the per-token log-ratios (as in the paper,
  verl and TRL), clamped to +-20 after averaging. "gspo" keeps the gradient through the mean;
  "gspo_token" is verl's ``loss_mode=gspo`` / TRL's ``"sequence_token"``. Neither forces an
  aggregation: with per-sequence advantages, seq-mean-token-mean (or token-mean) aggregation
  gives the per-sequence objective.
- CISPO: ``eps_high=4.0`` (cap 5.0 on the weight, the ScaleRL value TRL recommends as
  ``epsilon_high=5.0``; TRL caps at ``epsilon_high`` itself, we cap at ``1 + eps_high`` like verl
  and the MiniMax-M1 paper) and ``eps_low=None`` (no lower bound, as the paper; verl clips both
  sides with the PPO clip ratio).
- Clip-Cov / KL-Cov compute the covariance on float32 detached log-probs; clip_cov's random
  choice takes a ``torch.Generator`` (verl uses the global RNG). Chosen tokens get loss 0, as in
  verl and the paper. kl_cov's |logp - old| uses the unclamped difference (so its pull-back
  never vanishes); ``ppo_kl_coef`` default 0.1 is verl's config value (its code fallback is 1.0).
- geo_mean (GMPO): its clip is ``eps_low`` / ``eps_high`` in log space, default 0.4 (the paper's;
  verl reuses the PPO ``clip_ratio``, 0.2); its mean log-ratio is clamped to +-20 (verl leaves it
  unclamped); its clip fractions count tokens where the clamp is *active* (it blocks the gradient on
  the side of sign(A)); verl counts every token outside the band. It puts its per-sequence loss L_i
  on every valid token of row i, so seq_mean_token_mean is exactly GMPO's ``mean_i(L_i)``; it
  declares ``required_aggregation`` in its spec and ``GRPOLoss`` refuses any other. With a rollout correction,
  ``GRPOLoss`` scales row i by the geometric mean of its token IS weights,
  ``exp(mean_t log(w_t + 1e-10))`` (``sequence_is_weight``, as verl's geo_mean), not by their
  arithmetic mean (weights [2, 0.5]: 1, not 1.25).
- dual_clip and delta_clip coincide when ``delta == clip_ratio_c > 1 + eps_high``: both cap the
  loss of an A < 0 token at ``-A * c`` once ``r > c``.

Metrics (detached float32 scalars, 0 when no token is valid): ``ratio_min/mean/max`` over
valid tokens (the ratio the loss uses: s_i for GSPO); ``clip_frac_low`` = frac(A < 0 and
r < 1 - eps_low), ``clip_frac_high`` = frac(A > 0 and r > 1 + eps_high) for the clipping losses
(TRL's clip_ratio/low_mean, high_mean); ``clip_frac_dual`` = frac(A < 0 and r > c) for
dual_clip / delta_clip; geo_mean: ``clip_frac_high`` / ``clip_frac_low``; ``clip_cov_frac`` and ``kl_cov_frac``: fraction of valid tokens chosen.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .guards import clamp_log_ratio
from .logprobs import masked_mean
from .ratios import (
    LossInputs,
    PolicyLossOutput,
    check_eps,
    clip_metrics,
    clipped_surrogate,
    loss_output,
    prepare_inputs,
    ratio_metrics,
    valid_fraction,
)
from .registry import POLICY_LOSSES
from .specs import PolicyLossSpec

__all__ = [
    "PolicyLossOutput",
    "clipped_surrogate",
    "ppo_loss",
    "dual_clip_loss",
    "delta_clip_loss",
    "gspo_loss",
    "gspo_token_loss",
    "cispo_loss",
    "clip_cov_loss",
    "kl_cov_loss",
    "geo_mean_loss",
]


def _ppo_parts(x: LossInputs, eps_low: float, eps_high: float, ratio_cap: float | None = None):
    """(token ratio [B, T], clipped surrogate loss [B, T], clip metrics)."""
    check_eps(eps_low, eps_high)
    ratio = torch.exp(clamp_log_ratio(x.log_ratio))  # [B, T]
    loss = clipped_surrogate(ratio, x.adv, eps_low, eps_high, ratio_cap)
    return ratio, loss, clip_metrics(ratio, x, eps_low, eps_high)


@POLICY_LOSSES.register("ppo")
def ppo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    generator: torch.Generator | None = None,
) -> PolicyLossOutput:
    """PPO / GRPO clipped surrogate with Clip-Higher (DAPO: eps_high = 0.28).

    L_t = -min(r_t A, clip(r_t, 1 - eps_low, 1 + eps_high) A),  r_t = exp(clamp(logp - old, +-20)).
    logp, old_logp, mask: [B, T]; advantages: [B] or [B, T]. Defaults 0.2 / 0.2 (verl
    clip_ratio, TRL epsilon). ``generator`` is unused.
    """
    x = prepare_inputs(logp, old_logp, advantages, mask)
    _, loss, metrics = _ppo_parts(x, eps_low, eps_high)
    return loss_output(loss, x.valid, metrics)


@POLICY_LOSSES.register("dual_clip")
def dual_clip_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    generator: torch.Generator | None = None,
) -> PolicyLossOutput:
    """Dual-clip PPO (Ye et al. 2019; verl ``clip_ratio_c``, default 3.0, must be > 1).

    L_t = ppo_t for A >= 0;  L_t = min(ppo_t, -A c) for A < 0, so a negative-advantage token whose
    ratio exploded (r > c) contributes at most -A c and no gradient. Shapes as ``ppo_loss``.
    Extra metric ``clip_frac_dual`` = frac(A < 0 and r > c).
    """
    if not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c must be > 1, got {clip_ratio_c}")
    x = prepare_inputs(logp, old_logp, advantages, mask)
    ratio, loss, metrics = _ppo_parts(x, eps_low, eps_high)
    loss = torch.where(x.adv < 0, torch.minimum(loss, -x.adv * clip_ratio_c), loss)
    metrics["clip_frac_dual"] = valid_fraction((x.adv < 0) & (ratio.detach() > clip_ratio_c), x.valid)
    return loss_output(loss, x.valid, metrics)


@POLICY_LOSSES.register("delta_clip")
def delta_clip_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    delta: float = 4.0,
    generator: torch.Generator | None = None,
) -> PolicyLossOutput:
    """Two-sided GRPO clip (INTELLECT-2; TRL ``delta``, whose recipe uses delta = 4).

    L_t = -min(min(r_t, delta) A, clip(r_t, 1 - eps_low, 1 + eps_high) A). Choose
    delta > 1 + eps_high. Shapes as ``ppo_loss``. ``clip_frac_dual`` = frac(A < 0 and r > delta).
    """
    if not delta > 0:
        raise ValueError(f"delta must be > 0, got {delta}")
    x = prepare_inputs(logp, old_logp, advantages, mask)
    ratio, loss, metrics = _ppo_parts(x, eps_low, eps_high, ratio_cap=delta)
    metrics["clip_frac_dual"] = valid_fraction((x.adv < 0) & (ratio.detach() > delta), x.valid)
    return loss_output(loss, x.valid, metrics)


def _seq_log_ratio(x: LossInputs) -> Tensor:
    """[B] mean_t(logp - old) over each row's valid tokens (0 for an empty row), with gradient."""
    return masked_mean(x.log_ratio, x.valid, dim=-1)


@POLICY_LOSSES.register("gspo")
def gspo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    generator: torch.Generator | None = None,
) -> PolicyLossOutput:
    """GSPO, sequence-level importance ratio (Zheng et al. 2025; eps 3e-4 / 4e-4 from the paper).

    s_i = exp(clamp(mean_t(logp_it - old_it), +-20))   (length-normalised, gradient through the mean)
    L_it = -min(s_i A_it, clip(s_i, 1 - eps_low, 1 + eps_high) A_it) on every valid token of row i.
    With A [B], L_it = L_i on each token, so token-mean-of-row aggregation is the GSPO objective.
    Shapes as ``ppo_loss``; clip metrics are token-weighted on s_i.
    """
    check_eps(eps_low, eps_high)
    x = prepare_inputs(logp, old_logp, advantages, mask)
    s = torch.exp(clamp_log_ratio(_seq_log_ratio(x))).unsqueeze(-1).expand_as(x.logp)  # [B, T]
    loss = clipped_surrogate(s, x.adv, eps_low, eps_high)
    return loss_output(loss, x.valid, clip_metrics(s, x, eps_low, eps_high))


@POLICY_LOSSES.register("gspo_token")
def gspo_token_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    generator: torch.Generator | None = None,
) -> PolicyLossOutput:
    """GSPO-token (verl loss_mode=gspo, TRL importance_sampling_level="sequence_token").

    s_it = exp(clamp(sg[log s_i] + logp_it - sg[logp_it], +-20)): value s_i, gradient
    d s_it / d logp_it = s_i (per token, not 1/|o_i| spread over the row).
    L_it = -min(s_it A_it, clip(s_it, 1 - eps_low, 1 + eps_high) A_it).
    Same values as ``gspo_loss``; same gradient under seq-mean-token-mean aggregation when a
    row's tokens share one advantage, different gradient otherwise. Shapes as ``ppo_loss``.
    """
    check_eps(eps_low, eps_high)
    x = prepare_inputs(logp, old_logp, advantages, mask)
    log_s = _seq_log_ratio(x).detach().unsqueeze(-1)  # [B, 1]
    s = torch.exp(clamp_log_ratio(log_s + x.logp - x.logp.detach()))  # [B, T], value s_i
    loss = clipped_surrogate(s, x.adv, eps_low, eps_high)
    return loss_output(loss, x.valid, clip_metrics(s, x, eps_low, eps_high))


@POLICY_LOSSES.register("cispo")
def cispo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_high: float = 4.0,
    eps_low: float | None = None,
    generator: torch.Generator | None = None,
) -> PolicyLossOutput:
    """CISPO (MiniMax-M1): clip the importance weight, not the update.

    L_t = -sg[clip(r_t, 1 - eps_low, 1 + eps_high)] * A * logp_t; every valid token gets the
    gradient -sg[w_t] A d logp_t. eps_low=None: no lower bound (the paper's choice); eps_high=4.0:
    weight cap 5.0 (ScaleRL's epsilon_max as TRL recommends it). Shapes as ``ppo_loss``.
    clip_frac_high = frac(A > 0 and r > 1 + eps_high) (TRL's cispo_clip_ratio).
    """
    check_eps(0.0 if eps_low is None else eps_low, eps_high)
    x = prepare_inputs(logp, old_logp, advantages, mask)
    ratio = torch.exp(clamp_log_ratio(x.log_ratio))  # [B, T]
    low = None if eps_low is None else 1.0 - eps_low
    weight = ratio.clamp(min=low, max=1.0 + eps_high).detach()  # [B, T], stop-gradient
    loss = -weight * x.adv * x.logp
    return loss_output(loss, x.valid, clip_metrics(ratio, x, eps_low, eps_high))


def _token_cov(x: LossInputs) -> Tensor:
    """[B, T] detached cov_t = (A_t - mean A) * (logp_t - mean logp), means over valid tokens; 0 off-mask."""
    lp = x.logp.detach()
    cov = (x.adv - masked_mean(x.adv, x.valid)) * (lp - masked_mean(lp, x.valid))
    return torch.where(x.valid, cov, torch.zeros((), dtype=cov.dtype, device=cov.device))


def _num_chosen(ratio: float, n_valid: int) -> int:
    """max(1, int(ratio * N)) tokens (verl), at most N; 0 when N = 0."""
    return min(max(1, int(ratio * n_valid)), n_valid) if n_valid > 0 else 0


@POLICY_LOSSES.register("clip_cov")
def clip_cov_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    clip_ratio: float = 2e-4,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    generator: torch.Generator | None = None,
) -> PolicyLossOutput:
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs"; verl clip_cov).

    cov_t = (A_t - mean A)(logp_t - mean logp) over valid tokens (detached). Among valid tokens
    not already clipped by PPO with lb < cov_t < ub, pick n = max(1, int(clip_ratio * N)) at
    random (``generator``) and set their loss to 0 (no gradient); the rest get the PPO loss.
    Defaults are verl's (2e-4, 1.0, 5.0). Shapes as ``ppo_loss``. Metric ``clip_cov_frac``.
    """
    if clip_ratio <= 0:
        raise ValueError(f"clip_ratio must be > 0, got {clip_ratio}")
    x = prepare_inputs(logp, old_logp, advantages, mask)
    ratio, loss, metrics = _ppo_parts(x, eps_low, eps_high)
    r = ratio.detach()
    clipped = -x.adv * r.clamp(1.0 - eps_low, 1.0 + eps_high) > -x.adv * r  # [B, T]
    cov = _token_cov(x)
    candidates = x.valid & ~clipped & (cov > clip_cov_lb) & (cov < clip_cov_ub)  # [B, T]
    idx = candidates.flatten().nonzero().squeeze(-1)  # row-major order: reproducible
    n = min(_num_chosen(clip_ratio, int(x.valid.sum().item())), idx.numel())
    chosen = torch.zeros_like(x.valid)
    if n > 0:
        device = generator.device if generator is not None else torch.device("cpu")
        perm = torch.randperm(idx.numel(), generator=generator, device=device)[:n].to(idx.device)
        chosen.view(-1)[idx[perm]] = True
    loss = torch.where(chosen, torch.zeros((), dtype=loss.dtype, device=loss.device), loss)
    metrics["clip_cov_frac"] = valid_fraction(chosen, x.valid)
    return loss_output(loss, x.valid, metrics)


@POLICY_LOSSES.register("kl_cov")
def kl_cov_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    kl_cov_ratio: float = 2e-4,
    ppo_kl_coef: float = 0.1,
    generator: torch.Generator | None = None,
) -> PolicyLossOutput:
    """KL-Cov (Cui et al. 2025; verl kl_cov, defaults kl_cov_ratio 2e-4, ppo_kl_coef 0.1).

    L_t = -A_t r_t (no clipping) on every valid token, plus ppo_kl_coef * |logp_t - old_t| on
    the k = max(1, int(kl_cov_ratio * N)) valid tokens with the largest cov_t (as Clip-Cov).
    Shapes as ``ppo_loss``. Metric ``kl_cov_frac``; no clip fractions (nothing is clipped).
    """
    if kl_cov_ratio <= 0:
        raise ValueError(f"kl_cov_ratio must be > 0, got {kl_cov_ratio}")
    x = prepare_inputs(logp, old_logp, advantages, mask)
    ratio = torch.exp(clamp_log_ratio(x.log_ratio))  # [B, T]
    loss = -x.adv * ratio
    k = _num_chosen(kl_cov_ratio, int(x.valid.sum().item()))
    chosen = torch.zeros_like(x.valid)
    if k > 0:
        cov = torch.where(x.valid, _token_cov(x), float("-inf"))
        chosen.view(-1)[cov.flatten().topk(k).indices] = True
    loss = loss + torch.where(chosen, ppo_kl_coef * x.log_ratio.abs(), 0.0)
    metrics = ratio_metrics(ratio, x.valid)
    metrics["kl_cov_frac"] = valid_fraction(chosen, x.valid)
    return loss_output(loss, x.valid, metrics)


def _row_geometric_mean(weight: Tensor, mask: Tensor) -> Tensor:
    """GMPO's IS weight per row (verl): exp(mean_t log(w_t + 1e-10)) over the valid tokens of ``mask``,
    broadcast to them. weight, mask [B, T] -> [B, T] (0 on padding and on empty rows); detached."""
    m = mask.detach().float()
    log_w = torch.log(weight.detach().float() + 1e-10)  # [B, T]; a zero weight (MIS) counts as 1e-10
    return torch.exp(masked_mean(log_w, m, dim=-1, keepdim=True)) * m


@POLICY_LOSSES.register(
    "geo_mean",
    spec=PolicyLossSpec(required_aggregation="seq_mean_token_mean", sequence_is_weight=_row_geometric_mean),
)
def geo_mean_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.4,
    eps_high: float = 0.4,
    generator: torch.Generator | None = None,
) -> PolicyLossOutput:
    """GMPO, geometric-mean policy optimisation (arXiv 2507.20673; verl ``geo_mean``).

    Per token, the log-ratio is clipped in log space on the side of sign(A):
    l_t = sign(A) min(sign(A) d_t, sign(A) clamp(d_t, -eps_low, eps_high)), d_t = logp_t - old_t;
    s_i = exp(clamp(sum_t l_t / |o_i|, +-20)), A_i = mean_t A_t, L_i = -A_i s_i, written on every
    valid token of row i (seq_mean_token_mean, required, gives mean_i L_i). eps 0.4 (paper).
    """
    check_eps(eps_low, eps_high)
    x = prepare_inputs(logp, old_logp, advantages, mask)
    sign = torch.sign(x.adv)  # [B, T]
    clamped = x.log_ratio.clamp(-eps_low, eps_high)
    clipped = sign * torch.minimum(sign * x.log_ratio, sign * clamped)  # [B, T]
    s = torch.exp(clamp_log_ratio(masked_mean(clipped, x.valid, dim=-1)))  # [B]
    adv_seq = masked_mean(x.adv, x.valid, dim=-1)  # [B]
    loss = (-adv_seq * s).unsqueeze(-1).expand_as(x.logp)  # [B, T]
    active = (sign * clamped < sign * x.log_ratio).detach()  # the clamp blocks the gradient here
    metrics = ratio_metrics(s.unsqueeze(-1).expand_as(x.logp), x.valid)
    metrics["clip_frac_high"] = valid_fraction(active & (x.adv > 0), x.valid)
    metrics["clip_frac_low"] = valid_fraction(active & (x.adv < 0), x.valid)
    return loss_output(loss, x.valid, metrics)
