"""Group statistics shared by the advantage estimators (:mod:`.advantages`, :mod:`.passk_advantages`, :mod:`.shaping`).

Rows are group-contiguous: B = P prompts x G completions, rows ``p*G .. p*G+G-1`` are prompt p's
group. Everything is float32; a group whose values are all equal is centred to exactly 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["as_groups", "center_groups", "check_std_group", "bessel_std", "constant_rows", "whiten", "whiten_signal"]


def as_groups(rewards: Tensor, group_size: int) -> Tensor:
    """View group-contiguous per-completion values [B] as float32 groups [P, G].

    Raises ``ValueError`` if ``rewards`` is not 1-D, ``group_size`` < 1, or B is not a
    multiple of ``group_size``.
    """
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    batch = rewards.shape[0]
    if batch % group_size != 0:
        raise ValueError(f"batch size B={batch} is not divisible by group_size={group_size}")
    return rewards.to(torch.float32).reshape(batch // group_size, group_size)  # [P, G]


def check_std_group(name: str, rewards: Tensor, group_size: int) -> None:
    """Estimators that divide by the group's std need G >= 2 (a std of one sample is undefined)."""
    if group_size < 2 and rewards.numel() > 0:
        raise ValueError(
            f"advantage {name!r} divides by the std of each group's rewards, which needs group_size >= 2 "
            f"completions per prompt, got group_size={group_size}: sample at least 2 per prompt "
            "(rollout.sampling.n), or use an estimator without the std such as 'dr_grpo'"
        )


def center_groups(groups: Tensor, baseline: Tensor) -> Tensor:
    """groups - baseline, with rows whose values are all equal forced to exactly 0. [P, G]"""
    constant = groups.amax(dim=1, keepdim=True) == groups.amin(dim=1, keepdim=True)  # [P, 1]
    return torch.where(constant, torch.zeros_like(groups), groups - baseline)


def bessel_std(x: Tensor, dim: int | None = None) -> Tensor:
    """Bessel-corrected std along ``dim`` (all elements if None); 0 (not nan) for one sample."""
    count = x.numel() if dim is None else x.shape[dim]
    if count < 2 or x.numel() == 0:
        return torch.zeros_like(x.sum() if dim is None else x.sum(dim=dim, keepdim=True))
    return x.std() if dim is None else x.std(dim=dim, keepdim=True)


def whiten(x: Tensor, eps: float) -> Tensor:
    """(x - mean(x)) / (std(x) + eps) over all elements of x; 0 where x is constant. [B]"""
    if x.numel() == 0:
        return x
    constant = x.amax() == x.amin()  # [] (no host sync)
    return torch.where(constant, torch.zeros_like(x), (x - x.mean()) / (bessel_std(x) + eps))


def constant_rows(groups: Tensor) -> Tensor:
    """[P, G] -> [B] bool: the row's group has all-equal values."""
    constant = groups.amax(dim=1, keepdim=True) == groups.amin(dim=1, keepdim=True)  # [P, 1]
    return constant.expand_as(groups).reshape(-1)


def whiten_signal(x: Tensor, constant: Tensor, eps: float) -> Tensor:
    """``whiten(x)``, with the rows of all-equal groups (``constant`` [B]) kept at exactly 0:
    subtracting the batch mean would otherwise give them -mean(x) / std(x), float noise of
    ~1e-8 when every group is centred. [B]"""
    return torch.where(constant, torch.zeros_like(x), whiten(x, eps))
