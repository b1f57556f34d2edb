"""What every policy loss shares: its inputs checked and broadcast, its output, its ratio metrics.

The losses (:mod:`.policy_losses`, :mod:`.trust_region_losses`, :mod:`.pg_losses`) map
``(logp, old_logp, advantages, mask)`` to :class:`PolicyLossOutput` (a per-token loss [B, T], 0 on
masked tokens, and detached float32 scalar metrics). :func:`prepare_inputs` checks the shapes,
upcasts to float32 and broadcasts A [B] -> [B, T]; :func:`token_ratio` is
``r_t = exp(clamp(logp_t - old_t, -20, 20))``; :func:`clipped_surrogate` is PPO's clipped objective.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .guards import clamp_log_ratio
from .logprobs import masked_mean

__all__ = [
    "LossInputs",
    "PolicyLossOutput",
    "check_eps",
    "clip_metrics",
    "clipped_surrogate",
    "loss_output",
    "prepare_inputs",
    "ratio_metrics",
    "token_ratio",
    "valid_fraction",
]


class PolicyLossOutput(NamedTuple):
    """Per-token policy loss and its metrics."""

    loss: Tensor
    """[B, T] float32 per-token loss, 0 on masked tokens, before aggregation."""
    metrics: dict[str, Tensor]
    """Detached float32 scalars (see the module docstring)."""


class LossInputs(NamedTuple):
    logp: Tensor  # [B, T] float32 (>= fp32), 0 on masked tokens, differentiable
    log_ratio: Tensor  # [B, T] logp - old, unclamped, 0 on masked tokens
    adv: Tensor  # [B, T] detached advantages, 0 on masked tokens
    valid: Tensor  # [B, T] bool


def prepare_inputs(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor) -> LossInputs:
    """Check shapes, upcast to float32, broadcast A [B] -> [B, T], zero masked positions."""
    if logp.dim() != 2 or old_logp.shape != logp.shape or mask.shape != logp.shape:
        raise ValueError(
            f"logp, old_logp and mask must share one [B, T] shape; got {tuple(logp.shape)}, "
            f"{tuple(old_logp.shape)}, {tuple(mask.shape)}"
        )
    dtype = torch.promote_types(logp.dtype, torch.float32)
    valid = mask != 0  # [B, T]
    zero = torch.zeros((), dtype=dtype, device=logp.device)
    adv = advantages.detach().to(dtype)
    if adv.shape == logp.shape[:1]:
        adv = adv.unsqueeze(-1).expand_as(logp)  # [B] -> [B, T]
    elif adv.shape != logp.shape:
        raise ValueError(f"advantages must be [B] or [B, T] = {tuple(logp.shape)}, got {tuple(adv.shape)}")
    lp = torch.where(valid, logp.to(dtype), zero)  # [B, T]
    old = old_logp.detach().to(dtype)
    log_ratio = torch.where(valid, lp - old, zero)  # [B, T]
    return LossInputs(lp, log_ratio, torch.where(valid, adv, zero), valid)


def check_eps(eps_low: float, eps_high: float) -> None:
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"eps_low and eps_high must be >= 0, got {eps_low}, {eps_high}")


def clipped_surrogate(
    ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float, ratio_cap: float | None = None
) -> Tensor:
    """The PPO clipped surrogate loss, shared by every clipping variant.

    L = -min(min(r, ratio_cap) * A, clip(r, 1 - eps_low, 1 + eps_high) * A)

    ``ratio_cap=None`` is plain PPO; a cap is TRL's two-sided ``delta``. ratio, adv: [B, T]
    (or any common shape) -> same shape. Gradient is zero where the clipped term is active.
    """
    unclipped = ratio if ratio_cap is None else ratio.clamp(max=ratio_cap)
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    return -torch.minimum(unclipped * adv, clipped * adv)


def valid_fraction(cond: Tensor, valid: Tensor) -> Tensor:
    """Fraction of valid tokens where ``cond`` holds (0 if none valid)."""
    return masked_mean(cond.float(), valid).detach()


def ratio_metrics(ratio: Tensor, valid: Tensor) -> dict[str, Tensor]:
    """ratio_min / ratio_mean / ratio_max over valid tokens, 0 when none is valid."""
    r = ratio.detach().float()
    any_valid = valid.any()
    inf = torch.tensor(float("inf"), device=r.device)
    r_min = torch.where(valid, r, inf).amin()
    r_max = torch.where(valid, r, -inf).amax()
    return {
        "ratio_min": torch.where(any_valid, r_min, 0.0),
        "ratio_mean": masked_mean(r, valid).detach(),
        "ratio_max": torch.where(any_valid, r_max, 0.0),
    }


def clip_metrics(ratio: Tensor, x: LossInputs, eps_low: float | None, eps_high: float) -> dict[str, Tensor]:
    """clip_frac_low (A < 0, r < 1 - eps_low), clip_frac_high (A > 0, r > 1 + eps_high), ratios."""
    r = ratio.detach()
    low = (x.adv < 0) & (r < 1.0 - eps_low) if eps_low is not None else torch.zeros_like(x.valid)
    metrics = {
        "clip_frac_low": valid_fraction(low, x.valid),
        "clip_frac_high": valid_fraction((x.adv > 0) & (r > 1.0 + eps_high), x.valid),
    }
    metrics.update(ratio_metrics(r, x.valid))
    return metrics


def loss_output(loss: Tensor, valid: Tensor, metrics: dict[str, Tensor]) -> PolicyLossOutput:
    zero = torch.zeros((), dtype=loss.dtype, device=loss.device)
    return PolicyLossOutput(torch.where(valid, loss, zero), metrics)


def token_ratio(x: LossInputs) -> Tensor:
    """r_t = exp(clamp(logp_t - old_t, +-20)) on the prepared inputs. [B, T]"""
    return torch.exp(clamp_log_ratio(x.log_ratio))  # [B, T]
