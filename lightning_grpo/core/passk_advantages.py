"""Advantages for pass@k-type objectives (registry ``ADVANTAGES``, verl / prime-rl names).

Same interface and row layout as :mod:`.advantages` (``fn(rewards [B], group_size, **params) ->
[B]`` float32, groups contiguous). With mean_g, std_g the group's mean and Bessel std:

    passk    A_i = (r_max - r_second) / (std_g + eps) for the group's best completion, 0 for the rest
    max_rl   A_i = (r_i - mean_g) / (mean_g + eps)

Departures (as for the estimators in :mod:`.advantages`): a group whose rewards are all equal gets
exactly 0; ``passk`` with G < 2 raises (as verl). ``passk`` gives ties for the best reward A = 0
(r_max - r_second = 0) and, among them, names the first row the best (verl's ``topk`` order on ties
is unspecified).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .groups import as_groups, as_mask, bessel_std, center_groups, check_std_group, group_mean
from .registry import ADVANTAGES

__all__ = ["passk_advantages", "max_rl_advantages"]


@ADVANTAGES.register("passk")
def passk_advantages(
    rewards: Tensor, group_size: int, *, scale_by_std: bool = True, eps: float = 1e-6, scored: Tensor | None = None
) -> Tensor:
    """Pass@k training (arXiv 2503.19595; verl ``grpo_passk``): only the best completion learns. [B] -> [B]

    A_best = (r_max - r_second) / (std_g + eps) (``scale_by_std``, verl's
    ``norm_adv_by_std_in_grpo`` default) or r_max - r_second; every other row 0. G >= 2 required. With
    ``scored``, best and second best among the scored rows; a group with fewer than 2 of them gets 0.
    """
    groups = as_groups(rewards, group_size)  # [P, G]
    mask = as_mask(scored, groups)
    check_std_group("passk", rewards, group_size)
    if groups.numel() == 0:
        return groups.reshape(-1)
    ranked = groups if mask is None else torch.where(mask, groups, -torch.inf)  # unscored rank last
    top = ranked.topk(2, dim=1).values  # [P, 2]
    gap = top[:, :1] - top[:, 1:]  # [P, 1]
    if scale_by_std:
        gap = gap / (bessel_std(groups, dim=1, mask=mask) + eps)
    best = torch.nn.functional.one_hot(ranked.argmax(dim=1), group_size).bool()  # [P, G], first max
    if mask is not None:
        best &= mask.sum(dim=1, keepdim=True) >= 2
    return torch.where(best, gap, torch.zeros_like(groups)).reshape(-1)


@ADVANTAGES.register("max_rl")
def max_rl_advantages(rewards: Tensor, group_size: int, *, eps: float = 1e-6, scored: Tensor | None = None) -> Tensor:
    """MaxRL (arXiv 2602.02710; prime-rl / SkyRL ``max_rl``): A_i = (r_i - mean_g) / (mean_g + eps). [B] -> [B]

    Dividing by the group's success rate instead of its std weights hard prompts up (1 / p): the
    gradient of E log p(success) rather than of E p(success). Meant for rewards >= 0.
    """
    groups = as_groups(rewards, group_size)  # [P, G]
    mask = as_mask(scored, groups)
    mean = group_mean(groups, mask)
    return (center_groups(groups, mean, mask) / (mean + eps)).reshape(-1)


# read by the run plan's checks (lightning_grpo.plan.run_plan): these compare a completion with its group
for _estimator in (passk_advantages, max_rl_advantages):
    _estimator.group_relative = True
    _estimator.takes_scored = True  # leaves unscored rows (``scored``) out of its group statistics
passk_advantages.divides_by_group_std = True
