"""Train-inference mismatch: importance corrections (TIS / MIS), off-policy masking, metrics.

The rollout engine samples o ~ pi_roll, but the loss assumes o ~ pi_old (the trainer's own
log-probs of the same policy). Kernels and precision make the two differ, so the policy
gradient is off-policy. With rho_t = pi_old(o_t) / pi_roll(o_t) = exp(old_t - roll_t):

    tis_token     w_t = min(rho_t, cap)                                (verl rollout_is="token")
    tis_seq       w_i = min(exp(sum_t (old - roll)), cap)  (product)   (TRL "sequence_truncate", verl "sequence")
    tis_seq_geo   w_i = min(exp(mean_t (old - roll)), cap) (geo mean)  (ms-swift / OpenRLHF sequence modes)
    mis_token     w_t = rho_t if low <= rho_t <= high else 0       (IcePop; verl "lower_upper"; TRL "token_mask")
    mis_seq       w_i = prod_t rho_t if in [low, high] else 0      (TRL "sequence_mask")

Registry ``CORRECTIONS``: ``fn(old_logp [B,T], rollout_logp [B,T], mask [B,T], **params) ->
CorrectionOutput``. The weight is detached (it changes the sampling measure, not the
objective) and multiplies the per-token loss. MIS gives the tokens outside its band weight 0;
they stay in the loss's normalisers (token count, |o_i|) and in the batch-normalisation mean,
exactly as verl's IcePop and TRL's masks do (to drop tokens from the normalisers instead, use
rollout rejection, :mod:`.rejection`). ``CorrectionOutput.mask`` reports the band (0 where MIS
zeroed the weight) and is not a loss mask. All log-ratios (token or summed) are clamped to +-20
before ``exp``; weights are 0 on padding.

``normalize_is_weight`` rescales a batch's weights to mean 1 (verl ``rollout_is_batch_normalize``),
``is_weight_sums`` gives the (sum, count) of that mean so a trainer can add them up over the whole
optimizer-step batch (all micro-batches and ranks) first.
``off_policy_sequence_mask`` (DeepSeek-V3.2, registry ``TOKEN_MASKS`` "off_policy_sequence")
drops negative-advantage sequences that drifted too far; ``mismatch_metrics`` measures the gap.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .guards import clamp_log_ratio
from .logprobs import masked_mean
from .registry import CORRECTIONS, TOKEN_MASKS
from .specs import CorrectionSpec, Level


class CorrectionOutput(NamedTuple):
    weight: Tensor  # [B, T] float32 detached importance weight multiplying the per-token loss; 0 on padding
    mask: (
        Tensor  # [B, T] float32 0/1: tokens inside the MIS band (report only, not a loss mask); the input mask for TIS
    )
    metrics: dict[str, Tensor]  # detached scalars


def _log_ratio(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """(old - roll with padding set to 0, float mask), both float32 [B, T] and detached."""
    m = mask.detach().to(torch.float32)
    diff = old_logp.detach().float() - rollout_logp.detach().float()
    return torch.where(m != 0, diff, torch.zeros_like(diff)), m


def _seq_valid(m: Tensor) -> Tensor:
    return (m.sum(-1, keepdim=True) > 0).float()  # [B, 1] 1 for rows with at least one valid token


def _truncated(log_w: Tensor, m: Tensor, cap: float, valid: Tensor) -> CorrectionOutput:
    """Shared TIS tail: w = min(exp(clamp(log_w)), cap). log_w and valid: [B, T] (token) or [B, 1] (sequence)."""
    if cap <= 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    raw = torch.exp(clamp_log_ratio(log_w))
    w = (raw.clamp(max=cap).expand_as(m) * m).detach()  # [B, T]
    metrics = {"is_weight_mean": masked_mean(w, m), "is_frac_truncated": masked_mean((raw > cap).float(), valid)}
    return CorrectionOutput(w, m, metrics)


@CORRECTIONS.register("tis_token", spec=CorrectionSpec(level="token"))
def tis_token(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, *, cap: float = 2.0) -> CorrectionOutput:
    """Token-level truncated IS: w_t = min(exp(old_t - roll_t), cap). [B, T] in, [B, T] weight.

    cap default 2.0 (verl ``rollout_is_threshold``; TRL's ``vllm_importance_sampling_clip_max``
    is 3.0). Metrics: is_weight_mean (over valid tokens), is_frac_truncated (tokens with rho > cap).
    """
    d, m = _log_ratio(old_logp, rollout_logp, mask)
    return _truncated(d, m, cap, m)


@CORRECTIONS.register("tis_seq", spec=CorrectionSpec(level="sequence"))
def tis_seq(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, *, cap: float = 2.0) -> CorrectionOutput:
    """Sequence-level truncated IS, product form: w_i = min(exp(clamp(sum_t (old - roll), +-20)), cap).

    Broadcast to the valid tokens of row i. The product of token ratios is the exact sequence
    likelihood ratio (TRL "sequence_truncate", verl rollout_is="sequence"). cap default 2.0
    (verl). is_frac_truncated counts non-empty sequences.
    """
    d, m = _log_ratio(old_logp, rollout_logp, mask)
    return _truncated(d.sum(-1, keepdim=True), m, cap, _seq_valid(m))  # log_w [B, 1]


@CORRECTIONS.register("tis_seq_geo", spec=CorrectionSpec(level="sequence"))
def tis_seq_geo(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, *, cap: float = 2.0) -> CorrectionOutput:
    """Sequence-level truncated IS, geometric mean: w_i = min(exp(mean_t (old - roll)), cap).

    The length-normalised ratio (ms-swift / OpenRLHF sequence modes): lower variance than the
    product, but biased; a long sequence with a small per-token drift keeps w near 1 where the
    product would explode. cap default 2.0; empty rows get w = 0.
    """
    d, m = _log_ratio(old_logp, rollout_logp, mask)
    return _truncated(masked_mean(d, m, dim=-1, keepdim=True), m, cap, _seq_valid(m))


def _band(log_w: Tensor, m: Tensor, low: float | None, high: float | None, valid: Tensor) -> CorrectionOutput:
    """Shared MIS tail: rho = exp(clamp(log_w)) is the weight where low <= rho <= high, else 0.

    log_w and valid: [B, T] (token level) or [B, 1] (sequence level).
    """
    if low is not None and high is not None and low > high:
        raise ValueError(f"low must be <= high, got low={low}, high={high}")
    rho = torch.exp(clamp_log_ratio(log_w))
    inside = torch.ones_like(rho, dtype=torch.bool)
    if low is not None:
        inside = inside & (rho >= low)
    if high is not None:
        inside = inside & (rho <= high)
    keep = (inside.float().expand_as(m) * m).detach()  # [B, T]
    w = (rho.expand_as(m) * keep).detach()
    metrics = {"is_weight_mean": masked_mean(w, keep), "is_frac_masked": masked_mean((~inside).float(), valid)}
    return CorrectionOutput(w, keep, metrics)


@CORRECTIONS.register("mis_token", spec=CorrectionSpec(level="token"))
def mis_token(
    old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, *, low: float | None = 0.5, high: float | None = 5.0
) -> CorrectionOutput:
    """Token-level masked IS (IcePop): w_t = rho_t if low <= rho_t <= high, else 0.

    rho_t = exp(old_t - roll_t). The weight inside the band is rho_t itself, not 1 (IcePop's
    M(k) = k on [alpha, beta], 0 outside; verl's ``rollout_is_threshold: "low_high"`` and TRL
    "token_mask" too). A zeroed token stays in the normalisers (see the module docstring).
    Defaults low = 0.5, high = 5.0: IcePop's alpha / beta (Ring-1T; INTELLECT-3 eq. 1).
    None = no bound. Metrics: is_weight_mean (tokens in the band), is_frac_masked (valid tokens zeroed).
    """
    d, m = _log_ratio(old_logp, rollout_logp, mask)
    return _band(d, m, low, high, m)


@CORRECTIONS.register("mis_seq", spec=CorrectionSpec(level="sequence"))
def mis_seq(
    old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, *, low: float | None = None, high: float | None = 3.0
) -> CorrectionOutput:
    """Sequence-level masked IS: w_i = exp(sum_t (old - roll)) if low <= w_i <= high, else 0 on row i.

    Product form (TRL "sequence_mask", its default mode). Defaults low = None (no lower bound),
    high = 3.0: TRL's ``vllm_importance_sampling_clip_min`` / ``clip_max``. The summed log-ratio
    is clamped to +-20 before exp. is_frac_masked counts non-empty sequences.
    """
    d, m = _log_ratio(old_logp, rollout_logp, mask)
    return _band(d.sum(-1, keepdim=True), m, low, high, _seq_valid(m))


def is_weight_sums(weight: Tensor, mask: Tensor, level: Level = "token") -> Tensor:
    """[2] float32 (sum, count) whose ratio is the batch-normalisation mean of ``weight`` [B, T].

    Token level: (sum of the weights of the valid tokens of ``mask``, their number); sequence
    level (the correction's ``CorrectionSpec.level``): (sum over non-empty rows of the row's weight,
    the number of non-empty rows). Zero weights (MIS outside its band) count, as in verl. Sums
    add up over micro-batches and ranks, so the mean of a whole optimizer-step batch is the
    ratio of the summed sums. Detached.
    """
    m = mask.detach().float()
    w = weight.detach().float()
    if level == "sequence":
        rows = (m.sum(-1) > 0).float()  # [B]
        return torch.stack([(masked_mean(w, m, dim=-1) * rows).sum(), rows.sum()])
    return torch.stack([(w * m).sum(), m.sum()])


def normalize_is_weight(
    weight: Tensor, mask: Tensor, level: Level = "token", mean: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """IS-weight batch normalisation (verl ``rollout_is_batch_normalize``): w / mean(w), so the
    weights average 1. weight, mask [B, T] -> (normalised weight [B, T], factor []); ``level``: the
    correction's ``CorrectionSpec.level``.

    ``mean``: the mean to divide by, e.g. of the whole optimizer-step batch over all micro-batches
    and ranks (from summed :func:`is_weight_sums`, as verl's all-reduced mean); None: the mean of
    the tensors given (see :func:`is_weight_sums` for what it averages). A mean <= 1e-8 leaves the
    weights as they are (factor 1), as verl. Detached.
    """
    m = mask.detach().float()
    if mean is None:
        total, count = is_weight_sums(weight, m, level)
        mean = total / count.clamp(min=1.0)
    mean = torch.as_tensor(mean, dtype=torch.float32, device=m.device)
    factor = torch.where(mean > 1e-8, mean, torch.ones_like(mean))
    return (weight.detach().float() / factor) * m, factor


@TOKEN_MASKS.register("off_policy_sequence")
def off_policy_sequence_mask(
    logp: Tensor, rollout_logp: Tensor, advantages: Tensor, mask: Tensor, delta: float
) -> Tensor:
    """DeepSeek-V3.2 off-policy sequence mask: M_i = 0 if A_i < 0 and mean_t(roll - sg[logp]) > delta, else 1.

    logp [B, T] (detached here), rollout_logp [B, T], advantages [B] (or [B, T]: the row's
    masked mean is used as A_i), mask [B, T] -> [B] float32 (1 keep, 0 drop). The mean is over
    valid tokens; an empty row has mean 0. mean_t(roll - logp) is the k1 estimate of
    KL(pi_roll || pi_theta) on tokens sampled from pi_roll. Positive-advantage sequences are
    always kept: the model learns most from its own mistakes, and only stale negatives are
    harmful. TRL ``off_policy_mask_threshold`` / ms-swift ``off_policy_sequence_mask_delta``
    (same rule: keep if A >= 0 or drift <= delta). The caller multiplies it into the loss mask,
    so masked rows leave the token-mean normaliser.
    """
    m = mask.detach().to(torch.float32)
    drift = masked_mean(rollout_logp.detach().float() - logp.detach().float(), m, dim=-1)  # [B]
    adv = advantages.detach().float()
    if adv.dim() == 2:
        adv = masked_mean(adv, m, dim=-1)  # [B]
    return (~((adv < 0) & (drift > delta))).float()


def mismatch_metrics(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """Size of the train-inference gap over valid tokens; detached float32 scalars, 0 if no valid token.

    - mismatch_mean_diff = mean_t(roll - old): k1 estimate of KL(pi_roll || pi_old).
    - mismatch_k3 = mean_t(exp(d) - d - 1), d = clamp(old - roll, +-20): the k3 estimate of
      KL(pi_roll || pi_old). The tokens were sampled from pi_roll, so this direction is the one
      k3 estimates without bias (E_roll[pi_old/pi_roll] = 1); same as verl's ``k3_kl``.
    - mismatch_max_abs = max_t |roll - old|.
    """
    d, m = _log_ratio(old_logp, rollout_logp, mask)  # d = old - roll, 0 on padding
    dc = clamp_log_ratio(d)
    return {
        "mismatch_mean_diff": masked_mean(-d, m),
        "mismatch_k3": masked_mean(torch.exp(dc) - dc - 1.0, m),
        "mismatch_max_abs": d.abs().amax() if d.numel() else d.new_zeros(()),  # padding is 0 in d
    }
