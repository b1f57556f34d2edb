"""Numerical guards: keep log-ratios finite and fail loudly on non-finite inputs.

A single NaN in ``old_logp`` turns the KL and the loss into NaN, the optimizer step writes NaN
into the weights and the policy then emits garbage (a known case: a verl GRPO run whose outputs
became "!!!!!!"). Two guards prevent this:

- ``clamp_log_ratio``: clamp a log-ratio to ``[-limit, limit]`` before ``exp`` (verl clamps to
  +-20 in ``kl_penalty`` and ``compute_policy_loss``), so ``exp`` stays below ``e**20 ~ 4.9e8``.
- ``check_finite``: raise ``NonFiniteError`` when a tensor is NaN/inf on a *valid* token
  (mask = 1). Padding positions may hold anything (engines often pad log-probs with NaN or
  -inf), so they are ignored.
"""

from __future__ import annotations

import torch
from torch import Tensor

#: Default clamp of a log-ratio before ``exp`` (verl: ``torch.clamp(log_ratio, -20, 20)``).
LOG_RATIO_LIMIT: float = 20.0


class NonFiniteError(ValueError):
    """A tensor holds NaN or inf on valid (mask = 1) tokens."""


def clamp_log_ratio(x: Tensor, limit: float = LOG_RATIO_LIMIT) -> Tensor:
    """Clamp a log-ratio elementwise: ``clamp(x, -limit, limit)``.

    Args:
        x: any shape, e.g. ``[B, T]`` log pi_a - log pi_b.
        limit: positive bound (default 20.0, verl's value).

    Returns:
        ``x`` clamped, same shape and dtype. The gradient is 1 inside the band and 0 outside
        (torch.clamp's), so a clamped token stops pushing the ratio further. NaN stays NaN
        (use ``check_finite`` to catch it).
    """
    if limit <= 0:
        raise ValueError(f"limit must be > 0, got {limit}")
    return x.clamp(min=-limit, max=limit)


def check_finite(name: str, tensor: Tensor, mask: Tensor | None = None, *, max_rows: int = 8) -> None:
    """Raise ``NonFiniteError`` if ``tensor`` is NaN/inf where ``mask`` is 1.

    Args:
        name: the tensor's name, used in the message (e.g. ``"old_logp"``).
        tensor: ``[B, T]`` (or any shape matching ``mask``), any float dtype.
        mask: ``[B, T]`` bool or float, 1 on valid tokens; ``None`` checks every element.
        max_rows: how many offending row indices to list in the message.

    The message names the tensor, the first ``max_rows`` row indices (dim 0) holding a
    non-finite valid value, and the total count of such values, e.g.
    ``"old_logp has 3 non-finite values (nan/inf) on valid tokens, in rows [0, 5]"``.
    Masked positions may be NaN/inf without error. Runs one device sync (``.item()``).
    """
    if not tensor.is_floating_point() and not tensor.is_complex():
        return  # integer tensors are always finite
    bad = ~torch.isfinite(tensor)  # [B, T]
    if mask is not None:
        if mask.shape != tensor.shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)} but mask has shape {tuple(mask.shape)}")
        bad = bad & (mask != 0)
    count = int(bad.sum().item())
    if count == 0:
        return
    if bad.dim() == 0:
        raise NonFiniteError(f"{name} is non-finite (nan/inf)")
    rows = bad.reshape(bad.shape[0], -1).any(dim=1).nonzero().flatten().tolist()
    shown = rows[:max_rows]
    more = f" (+{len(rows) - len(shown)} more rows)" if len(rows) > len(shown) else ""
    raise NonFiniteError(f"{name} has {count} non-finite values (nan/inf) on valid tokens, in rows {shown}{more}")
