"""Group statistics shared by the advantage estimators (:mod:`.advantages`, :mod:`.passk_advantages`, :mod:`.shaping`).

Rows are group-contiguous: B = P prompts x G completions, rows ``p*G .. p*G+G-1`` are prompt p's
group. Everything is float32; a group whose values are all equal is centred to exactly 0.

``scored`` ([B] bool, or its [P, G] view ``mask``; None = every row) marks the completions some reward
function scored: the others are left out of every mean, std and quantile and get 0, and a group with
fewer than 2 scored completions is centred to 0 throughout (TRL: a std of one sample is undefined).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "as_groups",
    "as_mask",
    "bessel_std",
    "center_groups",
    "check_std_group",
    "constant_rows",
    "group_mean",
    "whiten",
    "whiten_signal",
]


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


def as_mask(scored: Tensor | None, groups: Tensor) -> Tensor | None:
    """The [P, G] bool view of ``scored`` [B] next to ``groups`` [P, G]; None stays None (every row scored)."""
    if scored is None:
        return None
    scored = torch.as_tensor(scored, device=groups.device)
    if scored.shape != (groups.numel(),):
        raise ValueError(f"scored must be a [B]=({groups.numel()},) mask, got shape {tuple(scored.shape)}")
    return scored.to(torch.bool).reshape(groups.shape)


def group_mean(groups: Tensor, mask: Tensor | None = None) -> Tensor:
    """Each group's mean over its scored values (all when ``mask`` is None). [P, G] -> [P, 1]"""
    if mask is None:
        return groups.mean(dim=1, keepdim=True)
    count = mask.sum(dim=1, keepdim=True)  # [P, 1]
    return (groups * mask).sum(dim=1, keepdim=True) / count.clamp(min=1)


def check_std_group(name: str, rewards: Tensor, group_size: int) -> None:
    """Estimators that divide by the group's std need G >= 2 (a std of one sample is undefined)."""
    if group_size < 2 and rewards.numel() > 0:
        raise ValueError(
            f"advantage {name!r} divides by the std of each group's rewards, which needs group_size >= 2 "
            f"completions per prompt, got group_size={group_size}: sample at least 2 per prompt "
            "(rollout.sampling.n), or use an estimator without the std such as 'dr_grpo'"
        )


def center_groups(groups: Tensor, baseline: Tensor, mask: Tensor | None = None) -> Tensor:
    """groups - baseline, with rows whose (scored) values are all equal forced to exactly 0; with ``mask``
    unscored entries and groups of fewer than 2 scored values are 0 too. [P, G]"""
    constant = _constant(groups, mask)  # [P, 1]
    keep = ~constant if mask is None else ~constant & mask  # [P, G]
    return torch.where(keep, groups - baseline, torch.zeros_like(groups))


def _constant(groups: Tensor, mask: Tensor | None) -> Tensor:
    """[P, 1] bool: the group's (scored) values are all equal, or fewer than 2 of them are scored."""
    if mask is None:
        return groups.amax(dim=1, keepdim=True) == groups.amin(dim=1, keepdim=True)
    high = torch.where(mask, groups, -torch.inf).amax(dim=1, keepdim=True)
    low = torch.where(mask, groups, torch.inf).amin(dim=1, keepdim=True)
    return (high == low) | (mask.sum(dim=1, keepdim=True) < 2)


def bessel_std(x: Tensor, dim: int | None = None, mask: Tensor | None = None) -> Tensor:
    """Bessel-corrected std along ``dim`` (all elements if None); 0 (not nan) for one sample. With ``mask``
    (x's shape) over the masked-in elements only, 0 where fewer than 2 are."""
    if mask is not None:
        count = mask.sum() if dim is None else mask.sum(dim=dim, keepdim=True)
        mean = (x * mask).sum() if dim is None else (x * mask).sum(dim=dim, keepdim=True)
        mean = mean / count.clamp(min=1)
        square = torch.where(mask, (x - mean) ** 2, torch.zeros_like(x))
        total = square.sum() if dim is None else square.sum(dim=dim, keepdim=True)
        return torch.where(count > 1, (total / (count - 1).clamp(min=1)).sqrt(), torch.zeros_like(total))
    count = x.numel() if dim is None else x.shape[dim]
    if count < 2 or x.numel() == 0:
        return torch.zeros_like(x.sum() if dim is None else x.sum(dim=dim, keepdim=True))
    return x.std() if dim is None else x.std(dim=dim, keepdim=True)


def whiten(x: Tensor, eps: float, included: Tensor | None = None) -> Tensor:
    """(x - mean(x)) / (std(x) + eps) over all elements of x (those in ``included`` [B] bool, the others
    0); 0 where x is constant. [B]"""
    if x.numel() == 0:
        return x
    if included is None:
        constant = x.amax() == x.amin()  # [] (no host sync)
        return torch.where(constant, torch.zeros_like(x), (x - x.mean()) / (bessel_std(x) + eps))
    high, low = torch.where(included, x, -torch.inf).amax(), torch.where(included, x, torch.inf).amin()
    mean = (x * included).sum() / included.sum().clamp(min=1)
    out = (x - mean) / (bessel_std(x, mask=included) + eps)
    return torch.where(included & (high != low), out, torch.zeros_like(x))


def constant_rows(groups: Tensor, mask: Tensor | None = None) -> Tensor:
    """[P, G] -> [B] bool: the row's group has all-equal (scored) values, or the row is unscored (``mask``)."""
    constant = _constant(groups, mask).expand_as(groups)  # [P, G]
    return (constant if mask is None else constant | ~mask).reshape(-1)


def whiten_signal(x: Tensor, constant: Tensor, eps: float, included: Tensor | None = None) -> Tensor:
    """``whiten(x)`` (over the ``included`` rows), with the rows of all-equal groups (``constant`` [B]) kept
    at exactly 0: subtracting the batch mean would otherwise give them -mean(x) / std(x), float noise of
    ~1e-8 when every group is centred. [B]"""
    return torch.where(constant, torch.zeros_like(x), whiten(x, eps, included))
