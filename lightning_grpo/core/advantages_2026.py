"""Advantage estimators of the 2025-2026 frontier (registry ``ADVANTAGES``, verl / prime-rl names).

Same interface and row layout as :mod:`.advantages` (``fn(rewards [B], group_size, **params) ->
[B]`` float32, groups contiguous). With mean_g, std_g the group's mean and Bessel std:

    opo      A_i = r_i - sum_g(|o_j| r_j) / sum_g |o_j|       (length-weighted baseline, no std)
    gpg      A_i = alpha (r_i - mean_g) / f_norm,  alpha = B / #{j : r_j != 0}  (over the batch)
    passk    A_i = (r_max - r_second) / (std_g + eps) for the group's best completion, 0 for the rest
    max_rl   A_i = (r_i - mean_g) / (mean_g + eps)

``opo`` needs the completion lengths: it is marked ``needs_lengths`` and :class:`GRPOModule` passes
``lengths`` (sampled tokens per row) to such an estimator.

Departures (as for the estimators in :mod:`.advantages`): a group whose rewards are all equal gets
exactly 0 (so a group of one completion, G = 1, gets 0: verl's opo and gpg use a baseline of 0
there, i.e. A = r); ``passk`` with G < 2 raises (as verl). ``gpg``'s alpha counts the non-zero
rewards of the batch given (one generation batch on one rank; verl: the whole training batch).
``passk`` gives ties for the best reward A = 0 (r_max - r_second = 0) and, among them, names the
first row the best (verl's ``topk`` order on ties is unspecified).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .advantages import _centred, _check_std_group, _std, as_groups
from .registry import ADVANTAGES

__all__ = ["opo_advantages", "gpg_advantages", "passk_advantages", "max_rl_advantages"]


@ADVANTAGES.register("opo")
def opo_advantages(rewards: Tensor, group_size: int, *, lengths: Tensor) -> Tensor:
    """OPO (arXiv 2505.23585; verl ``opo``): A_i = r_i - sum_g(|o_j| r_j) / sum_g |o_j|. [B] -> [B]

    ``lengths`` [B]: completion lengths |o_i| (tokens that enter the loss). The length-weighted
    mean is the optimal baseline of an exactly on-policy gradient with token-sum losses. A group
    whose lengths sum to 0 uses the plain mean.
    """
    groups = as_groups(rewards, group_size)  # [P, G]
    lens = as_groups(torch.as_tensor(lengths, device=rewards.device), group_size)  # [P, G]
    total = lens.sum(dim=1, keepdim=True)  # [P, 1]
    weighted = (lens * groups).sum(dim=1, keepdim=True) / total.clamp(min=1e-12)
    baseline = torch.where(total > 0, weighted, groups.mean(dim=1, keepdim=True))
    return _centred(groups, baseline).reshape(-1)


opo_advantages.needs_lengths = True


@ADVANTAGES.register("gpg")
def gpg_advantages(rewards: Tensor, group_size: int, *, f_norm: float = 1.0) -> Tensor:
    """GPG (arXiv 2504.02546; verl ``gpg``): A_i = alpha (r_i - mean_g) / f_norm. [B] -> [B]

    alpha = B / max(1, number of non-zero rewards in the batch): when few completions earn
    anything, the group-relative signal is scaled up (verl; ``f_norm`` 1.0 as verl).
    """
    if f_norm <= 0:
        raise ValueError(f"f_norm must be > 0, got {f_norm}")
    groups = as_groups(rewards, group_size)  # [P, G]
    alpha = groups.numel() / torch.count_nonzero(groups).clamp(min=1)
    return (alpha * _centred(groups, groups.mean(dim=1, keepdim=True)) / f_norm).reshape(-1)


@ADVANTAGES.register("passk")
def passk_advantages(rewards: Tensor, group_size: int, *, scale_by_std: bool = True, eps: float = 1e-6) -> Tensor:
    """Pass@k training (arXiv 2503.19595; verl ``grpo_passk``): only the best completion learns. [B] -> [B]

    A_best = (r_max - r_second) / (std_g + eps) (``scale_by_std``, verl's
    ``norm_adv_by_std_in_grpo`` default) or r_max - r_second; every other row 0. G >= 2 required.
    """
    groups = as_groups(rewards, group_size)  # [P, G]
    _check_std_group("passk", rewards, group_size)
    if groups.numel() == 0:
        return groups.reshape(-1)
    top = groups.topk(2, dim=1).values  # [P, 2]
    gap = top[:, :1] - top[:, 1:]  # [P, 1]
    if scale_by_std:
        gap = gap / (_std(groups, dim=1) + eps)
    best = torch.nn.functional.one_hot(groups.argmax(dim=1), group_size).bool()  # [P, G], first max
    return torch.where(best, gap, torch.zeros_like(groups)).reshape(-1)


@ADVANTAGES.register("max_rl")
def max_rl_advantages(rewards: Tensor, group_size: int, *, eps: float = 1e-6) -> Tensor:
    """MaxRL (arXiv 2602.02710; prime-rl / SkyRL ``max_rl``): A_i = (r_i - mean_g) / (mean_g + eps). [B] -> [B]

    Dividing by the group's success rate instead of its std weights hard prompts up (1 / p): the
    gradient of E log p(success) rather than of E p(success). Meant for rewards >= 0.
    """
    groups = as_groups(rewards, group_size)  # [P, G]
    mean = groups.mean(dim=1, keepdim=True)
    return (_centred(groups, mean) / (mean + eps)).reshape(-1)


# read by the fit-time checks (lightning_grpo.validation): these compare a completion with its group
for _estimator in (opo_advantages, gpg_advantages, passk_advantages, max_rl_advantages):
    _estimator.group_relative = True
passk_advantages.divides_by_group_std = True
