"""Rollout rejection: drop tokens or whole sequences whose trainer / engine log-probs disagree.

With ``d_t = old_t - roll_t`` (trainer minus engine log-prob of the sampled token, clamped to
+-20) the per-token statistics are the k1 / k2 / k3 estimates of KL(pi_roll || pi_old) on tokens
sampled from pi_roll (verl ``rollout_corr_helper``):

    k1_t = -d_t = roll - old,   k2_t = d_t^2 / 2,   k3_t = exp(d_t) - 1 - d_t

Registry ``REJECTIONS``: ``fn(log_ratio [B, T] (= old - roll), mask [B, T], threshold) -> keep
[B, T] bool`` (False on padding). verl ``rollout_rs`` names and threshold meanings, with the
ratio rho_t = pi_old / pi_roll = exp(d_t) (the IS weight's direction):

    token_k1                  keep lower <= rho_t <= upper                (bounds given as ratios)
    token_k2, token_k3        keep k_t <= upper
    seq_sum_k1 / seq_mean_k1  keep the row if lower <= prod_t rho_t / exp(mean_t d_t) <= upper
    seq_sum_k2/k3, seq_mean_k2/k3, seq_max_k2/k3   keep the row if its statistic <= upper
    geo_mask                  keep the row if low <= exp(mean_t d_t) <= high  (SkyRL "Geo-RS": the
                              geometric mean of rho; defaults 0.99, 1.01)
    outlier_veto              drop the row if any token has rho_t < low or > high (defaults 1e-4,
                              100: SkyRL's outlier thresholds; verl's older veto had the lower one)

Every ratio bound is on rho = pi_old / pi_roll, so asymmetric bounds mean the same side in every
criterion: verl's acceptance sets (rollout_corr_math.md, C_lower <= rho <= C_upper) and its IS
weight use this direction. verl's code (``compute_rollout_rejection_mask``) compares k1 = -log rho
with log(lower) / log(upper), i.e. bounds 1 / rho: the same for a single ``upper`` (lower = 1 /
upper), but verl's asymmetric ``"a_b"`` is our ``[1/b, 1/a]``.

A k1 threshold is ``upper`` (then lower = 1 / upper, verl) or ``[lower, upper]``; the others take
one ``upper`` > 0. :func:`rejection_mask` applies several criteria at once (a token survives only
if every criterion keeps it, verl's comma-separated ``rollout_rs``) and logs, per criterion and in
total, the fraction of valid tokens and of non-empty sequences it masked.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from .guards import clamp_log_ratio
from .logprobs import masked_mean, masked_sum
from .registry import REJECTIONS

Threshold = float | Sequence[float | None] | None


class RejectionOutput(NamedTuple):
    keep: Tensor  # [B, T] float32 0/1: tokens kept (0 on padding)
    metrics: dict[str, Tensor]  # detached float32 scalars


def _stats(log_ratio: Tensor) -> dict[str, Tensor]:
    d = clamp_log_ratio(log_ratio.detach().float())  # [B, T]
    return {"k1": -d, "k2": 0.5 * d.square(), "k3": torch.exp(d) - 1.0 - d}


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"rejection {name!r}: a threshold must be a number > 0, got {value!r}")
    return float(value)


def _ratio_bounds(name: str, threshold: Threshold) -> tuple[float, float]:
    """(lower, upper) ratio bounds of a k1 criterion: ``upper`` (lower = 1 / upper) or ``[lower, upper]``."""
    if isinstance(threshold, (list, tuple)):
        if len(threshold) != 2:
            raise ValueError(f"rejection {name!r}: give [lower, upper] ratio bounds, got {threshold!r}")
        lower, upper = (_positive(name, v) for v in threshold)
    else:
        upper = _positive(name, threshold)
        lower = 1.0 / upper
    if lower > upper:
        raise ValueError(f"rejection {name!r}: lower bound {lower} is above the upper bound {upper}")
    return lower, upper


def _upper(name: str, threshold: Threshold) -> float:
    if isinstance(threshold, (list, tuple)):
        raise ValueError(
            f"rejection {name!r} takes one upper bound, got {threshold!r} (only k1 criteria take [lower, upper])"
        )
    return _positive(name, threshold)


def _sequence(values: Tensor, valid: Tensor, level: str) -> Tensor:
    """[B, T] -> [B, 1] row statistic over valid tokens (0 for an empty row)."""
    if level == "seq_sum":
        return masked_sum(values, valid, dim=-1).unsqueeze(-1)
    if level == "seq_mean":
        return masked_mean(values, valid, dim=-1, keepdim=True)
    row_max = torch.where(valid, values, float("-inf")).amax(dim=-1, keepdim=True)
    return torch.where(row_max == float("-inf"), torch.zeros_like(row_max), row_max)


def _register(level: str, stat: str) -> None:
    name = f"{level}_{stat}"

    @REJECTIONS.register(name)
    def criterion(log_ratio: Tensor, mask: Tensor, threshold: Threshold) -> Tensor:
        valid = mask != 0  # [B, T]
        values = _stats(log_ratio)[stat]  # [B, T]
        x = values if level == "token" else _sequence(values, valid, level)  # [B, T] or [B, 1]
        if stat == "k1":  # x = k1 statistic = -log rho (sum / mean): bound rho = exp(-x)
            lower, upper = _ratio_bounds(name, threshold)
            inside = (-x >= math.log(lower)) & (-x <= math.log(upper))
        else:
            inside = x <= _upper(name, threshold)
        return inside.expand_as(valid) & valid

    criterion.__name__ = criterion.__qualname__ = f"reject_{name}"
    bound = "exp(-" + stat + ") = pi_old / pi_roll is within [lower, upper]" if stat == "k1" else stat + " <= upper"
    criterion.__doc__ = f"verl rollout_rs {name!r}: keep where the {level.replace('_', ' ')} of {bound}. [B, T] bool."


for _level, _stat in [(lv, s) for lv in ("token", "seq_sum", "seq_mean") for s in ("k1", "k2", "k3")] + [
    ("seq_max", "k2"),
    ("seq_max", "k3"),
]:
    _register(_level, _stat)


def _band(
    name: str, threshold: Threshold, default: tuple[float | None, float | None]
) -> tuple[float | None, float | None]:
    """(low, high) of a two-sided band; None = that side unbounded; threshold None = the default."""
    if threshold is None:
        return default
    if not isinstance(threshold, (list, tuple)) or len(threshold) != 2:
        raise ValueError(f"rejection {name!r}: give [low, high] (either may be null), got {threshold!r}")
    low, high = (None if v is None else _positive(name, v) for v in threshold)
    if low is not None and high is not None and low > high:
        raise ValueError(f"rejection {name!r}: low {low} is above high {high}")
    return low, high


def _outside(log_value: Tensor, low: float | None, high: float | None) -> Tensor:
    out = torch.zeros_like(log_value, dtype=torch.bool)
    if low is not None:
        out = out | (log_value < math.log(low))
    if high is not None:
        out = out | (log_value > math.log(high))
    return out


@REJECTIONS.register("geo_mask")
def reject_geo_mask(log_ratio: Tensor, mask: Tensor, threshold: Threshold = None) -> Tensor:
    """Geometric-mean sequence mask (SkyRL ``geo_mask``, "Geo-RS"): keep row i if
    low <= exp(mean_t (old - roll)) <= high. threshold [low, high], default [0.99, 1.01]. [B, T] bool."""
    low, high = _band("geo_mask", threshold, (0.99, 1.01))
    valid = mask != 0
    mean = masked_mean(clamp_log_ratio(log_ratio.detach().float()), valid, dim=-1, keepdim=True)  # [B, 1]
    return ~_outside(mean, low, high).expand_as(valid) & valid


@REJECTIONS.register("outlier_veto")
def reject_outlier_veto(log_ratio: Tensor, mask: Tensor, threshold: Threshold = None) -> Tensor:
    """Outlier-token veto: drop row i if any valid token has exp(old - roll) < low or > high.
    threshold [low, high], default [1e-4, 100] (SkyRL). [B, T] bool."""
    low, high = _band("outlier_veto", threshold, (1e-4, 100.0))
    valid = mask != 0
    bad = _outside(log_ratio.detach().float(), low, high) & valid  # [B, T]
    return ~bad.any(dim=-1, keepdim=True).expand_as(valid) & valid


def check_rejection(criteria: Mapping[str, Threshold]) -> dict[str, Threshold]:
    """Validate names and thresholds before any work (one clear error naming the criterion)."""
    if not isinstance(criteria, Mapping) or not criteria:
        raise ValueError(
            f"rejection must map criterion names to thresholds, e.g. {{'token_k1': 2.0}}; got {criteria!r}"
        )
    probe = torch.zeros(1, 1)
    for name, threshold in criteria.items():
        REJECTIONS.get(name)(probe, torch.ones(1, 1), threshold)
    return dict(criteria)


def rejection_mask(
    old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, criteria: Mapping[str, Threshold]
) -> RejectionOutput:
    """Apply every criterion (a token is kept only if all keep it). [B, T] inputs -> keep [B, T] float.

    Metrics: ``rejection_masked_frac`` (valid tokens dropped), ``rejection_seq_masked_frac``
    (non-empty rows with any token dropped) and ``rejection/<name>_masked_frac`` per criterion.
    """
    m = mask.detach().float()
    valid = m != 0
    d = torch.where(valid, old_logp.detach().float() - rollout_logp.detach().float(), 0.0)  # [B, T]
    keep = valid.clone()
    metrics: dict[str, Tensor] = {}
    for name, threshold in criteria.items():
        kept = REJECTIONS.get(name)(d, m, threshold)
        metrics[f"rejection/{name}_masked_frac"] = masked_mean((valid & ~kept).float(), m)
        keep = keep & kept
    rows = valid.any(dim=-1)  # [B]
    dropped_rows = (valid & ~keep).any(dim=-1)
    metrics["rejection_masked_frac"] = masked_mean((valid & ~keep).float(), m)
    metrics["rejection_seq_masked_frac"] = masked_mean(dropped_rows.float(), rows)
    return RejectionOutput(keep.float(), metrics)
