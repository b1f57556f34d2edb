"""Reward shaping and sample selection: DAPO's overlong handling and dynamic sampling, GFPO.

Shaping (the ``soft_overlong`` reward; DAPO's overlong filter is ``rollout.selection.overlong_filter``):
    soft_overlong_punishment DAPO soft overlong punishment R_len(|y|), added to the reward:
                                 0                          if |y| <= L_max - L_cache
                                 ((L_max - L_cache) - |y|) / L_cache   if L_max - L_cache < |y| <= L_max
                                 -1                         if |y| > L_max
Selection (``SELECTIONS``):
    dynamic_sampling         keep the groups whose rewards are not all equal (DAPO), [P] bool.
    gfpo_length              GFPO: of G' completions per prompt keep the k shortest.
    gfpo_reward_per_token    GFPO: keep the k with the highest reward / length ("token
                             efficiency").
    ``gfpo_advantages`` then computes any registered estimator over the kept k per group only
    and gives dropped completions advantage 0 (no gradient).

Departures: GFPO ties (equal length, equal reward/length) go to the lower row index, so
selection is deterministic; reward / length uses max(length, 1) so an empty completion does
not divide by zero. DAPO's verl implementation (``overlong_penalty_factor``) also scales the
penalty by a factor; here the factor is 1, as in the paper.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .groups import as_groups
from .registry import ADVANTAGES, SELECTIONS


# ----------------------------------------------------------------------------------------------
# shaping
# ----------------------------------------------------------------------------------------------
def soft_overlong_punishment(lengths: Tensor, max_length: int, cache_length: int) -> Tensor:
    """DAPO soft overlong punishment, to be added to the rewards. [B] -> [B] float32 in [-1, 0]

        R_len(L) = 0                                   if L <= max_length - cache_length
                 = ((max_length - cache_length) - L) / cache_length
                                                       if max_length - cache_length < L <= max_length
                 = -1                                  if L > max_length

    ``lengths`` are completion lengths in tokens (|y| = mask.sum(1)). DAPO uses
    max_length = 20480 and cache_length = 4096. Requires 0 <= cache_length <= max_length;
    cache_length = 0 is the hard punishment (-1 only beyond max_length).
    """
    if max_length <= 0:
        raise ValueError(f"max_length must be positive, got {max_length}")
    if not 0 <= cache_length <= max_length:
        raise ValueError(f"cache_length must be in [0, max_length={max_length}], got {cache_length}")
    lengths = lengths.to(torch.float32)  # [B]
    expected = float(max_length - cache_length)
    band = (expected - lengths) / float(max(cache_length, 1))  # [B], used only inside the band
    penalty = torch.where(lengths <= expected, torch.zeros_like(lengths), band)
    return torch.where(lengths > max_length, torch.full_like(lengths, -1.0), penalty)


# ----------------------------------------------------------------------------------------------
# selection
# ----------------------------------------------------------------------------------------------
@SELECTIONS.register("dynamic_sampling")
def dynamic_sampling_filter(rewards: Tensor, group_size: int, atol: float = 0.0) -> Tensor:
    """DAPO dynamic sampling: keep_p = (max_g r - min_g r) > atol, i.e. not all equal. [B] -> [P]

    A group with one completion (G = 1) is never kept (it carries no group-relative signal).
    ``1 - keep.float().mean()`` is the fraction of groups with zero reward std.
    """
    groups = as_groups(rewards, group_size)  # [P, G]
    return (groups.amax(dim=1) - groups.amin(dim=1)) > atol  # [P] bool


def _keep_k_smallest(keys: Tensor, k: int) -> Tensor:
    """Per row of keys [P, G'], True on the k smallest; ties go to the lower index. -> [P, G']"""
    if not 1 <= k <= keys.shape[1]:
        raise ValueError(f"k must be in [1, group_size={keys.shape[1]}], got {k}")
    order = torch.sort(keys, dim=1, stable=True).indices[:, :k]  # [P, k]
    keep = torch.zeros(keys.shape, dtype=torch.bool, device=keys.device)
    return keep.scatter_(1, order, True)


def _check_lengths(rewards: Tensor, lengths: Tensor) -> None:
    if lengths.shape != rewards.shape:
        raise ValueError(f"lengths {tuple(lengths.shape)} and rewards {tuple(rewards.shape)} must match")


@SELECTIONS.register("gfpo_length")
def gfpo_length_selection(rewards: Tensor, lengths: Tensor, group_size: int, k: int) -> Tensor:
    """GFPO by length: in each group of G' keep the k shortest completions. [B'] -> [B'] bool

    Ties in length go to the lower row index. ``rewards`` is unused (same signature as the
    other GFPO selections).
    """
    _check_lengths(rewards, lengths)
    keys = as_groups(lengths, group_size)  # [P, G']
    return _keep_k_smallest(keys, k).reshape(-1)


@SELECTIONS.register("gfpo_reward_per_token")
def gfpo_reward_per_token_selection(rewards: Tensor, lengths: Tensor, group_size: int, k: int) -> Tensor:
    """GFPO by token efficiency: keep the k with the highest r_i / max(|o_i|, 1). [B'] -> [B'] bool

    Ties go to the lower row index.
    """
    _check_lengths(rewards, lengths)
    groups = as_groups(rewards, group_size)  # [P, G']
    tokens = as_groups(lengths, group_size).clamp(min=1.0)  # [P, G']
    return _keep_k_smallest(-(groups / tokens), k).reshape(-1)


def gfpo_advantages(rewards: Tensor, keep: Tensor, group_size: int, estimator: str = "grpo", **params) -> Tensor:
    """GFPO advantages: the estimator over the kept k of each group, 0 for dropped rows. [B'] -> [B']

        A_i = estimator({r_j : j kept in i's group})_i   if keep_i,   else 0

    Every group must keep the same number k >= 1 of rows (as the GFPO selections do); the kept
    rows keep their order. ``estimator`` is a name in ``ADVANTAGES``; ``params`` go to it
    (``lengths`` [B'], for ``opo``, and ``scored`` [B'] are cut to the kept rows).
    """
    groups = as_groups(rewards, group_size)  # [P, G']
    if keep.shape != rewards.shape:
        raise ValueError(f"keep {tuple(keep.shape)} and rewards {tuple(rewards.shape)} must match")
    keep = keep.to(torch.bool)
    counts = keep.view(-1, group_size).sum(dim=1)  # [P]
    out = torch.zeros(rewards.shape[0], dtype=torch.float32, device=rewards.device)  # [B']
    if counts.numel() == 0:
        return out
    k = int(counts[0].item())
    if k < 1 or bool((counts != k).any()):
        raise ValueError(f"every group must keep the same number k >= 1 of rows, got counts {counts.tolist()}")
    kept = keep.nonzero().squeeze(1)  # [P*k], group-contiguous because groups are
    for name in ("lengths", "scored"):  # per-row parameters (opo's lengths, the scored mask): the kept rows'
        if params.get(name) is not None:
            params = {**params, name: torch.as_tensor(params[name], device=rewards.device)[kept]}
    out[kept] = ADVANTAGES.get(estimator)(groups.reshape(-1)[kept], k, **params)
    return out
