"""Group-relative advantage estimators and multi-reward aggregation.

Every estimator turns one scalar reward per completion into one scalar advantage per
completion. Rows are group-contiguous: B = P prompts x G completions, and rows
``p*G .. p*G+G-1`` are prompt p's group. With mean_g, std_g the group's mean and
Bessel-corrected standard deviation (``torch.std`` default):

    grpo                   A_i = (r_i - mean_g) / (std_g + eps)
    dr_grpo                A_i = r_i - mean_g
    batch_std              A_i = (r_i - mean_g) / (std(all B rewards) + eps)
    rloo                   A_i = r_i - mean_{j != i} r_j = G/(G-1) * (r_i - mean_g)
    reinforce_pp_baseline  x_i = r_i - mean_g, then A = (x - mean(x)) / (std(x) + eps) over B
    qae                    A_i = r_i - q_K(group)   (optionally / (std_g + eps))
    opo                    A_i = r_i - sum_g(|o_j| r_j) / sum_g |o_j|   (length-weighted baseline, no std)
    gpg                    A_i = alpha (r_i - mean_g) / f_norm,  alpha = B / #{j : r_j != 0} (over the batch)

``opo`` needs the completion lengths: it is marked ``needs_lengths`` and :class:`GRPOModule` passes
``lengths`` (sampled tokens per row) to such an estimator. verl's opo and gpg use a baseline of 0
for a group of one completion (A = r); here it gets 0 like every all-equal group. ``gpg``'s alpha
counts the non-zero rewards of the batch given (one generation batch on one rank; verl: the whole
training batch). The pass@k-type estimators are in :mod:`.passk_advantages`.

Departures from the peers, all deliberate:
  * A group whose rewards are all equal gets A = 0 exactly: its centred reward is forced to 0
    so float rounding of the mean cannot leak through 1/eps. A group of one completion (G = 1)
    gets A = 0 from the estimators that only centre; those that divide by the group's std
    (``grpo``, ``qae`` with ``scale_by_std``) raise ``ValueError`` instead, since a std needs at
    least 2 samples (verl's grpo silently sets mean 0 / std 1 for G = 1, i.e. A = r).
  * Statistics are computed per completion, not per token (verl whitens reinforce++ over
    tokens with ``masked_whiten``).
  * Everything is computed in float32 (bf16/fp16/int rewards are upcast); results are float32.
  * ``scored`` [B] bool (a keyword of every estimator here, marked ``takes_scored``, and of both
    aggregations; None = every row): the rows no reward function scored are left out of their group's
    mean, std, quantile, best / second best and counts (and of the batch statistics of ``batch_std``,
    ``reinforce_pp_baseline``, ``gpg`` and GDPO's whitening) and get A = 0; a group with fewer than 2
    scored rows gets A = 0 throughout. This is TRL's ``nanmean`` / ``nanstd`` with NaN advantages set
    to 0, for every estimator.

Multi-reward (``REWARD_AGGREGATIONS``), rewards [B, R] with weights [R]:
    sum_then_normalize   A = estimator(rewards @ weights)
    normalize_then_sum   A = sum_k w_k * estimator(rewards[:, k])   (GDPO), then whitened over
                         the batch as the GDPO paper and TRL do (``batch_normalize=True``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from .groups import (
    as_groups,
    as_mask,
    bessel_std,
    center_groups,
    check_std_group,
    constant_rows,
    group_mean,
    whiten_signal,
)
from .registry import ADVANTAGES, REWARD_AGGREGATIONS

QuantileInterpolation = Literal["inverted_cdf", "linear", "lower", "higher", "midpoint", "nearest"]


def expand_to_tokens(advantages: Tensor, mask: Tensor) -> Tensor:
    """Broadcast per-completion advantages [B] to tokens: A[b, t] = A[b] * mask[b, t]. [B, T]

    ``mask`` may be bool or float; the result is float32 and 0 on padding.
    """
    return advantages.to(torch.float32).unsqueeze(1) * mask.to(torch.float32)


# ----------------------------------------------------------------------------------------------
# single-reward estimators: fn(rewards [B], group_size, **params) -> [B] float32
# ----------------------------------------------------------------------------------------------
@ADVANTAGES.register("grpo")
def grpo_advantages(rewards: Tensor, group_size: int, *, eps: float = 1e-6, scored: Tensor | None = None) -> Tensor:
    """GRPO: A_i = (r_i - mean_g r) / (std_g r + eps), std Bessel-corrected. [B] -> [B]

    All-equal groups give 0; G < 2 raises ``ValueError``. eps = 1e-6 as verl (TRL uses 1e-4).
    """
    groups = as_groups(rewards, group_size)  # [P, G]
    mask = as_mask(scored, groups)  # [P, G] or None
    check_std_group("grpo", rewards, group_size)
    centred = center_groups(groups, group_mean(groups, mask), mask)
    return (centred / (bessel_std(groups, dim=1, mask=mask) + eps)).reshape(-1)


@ADVANTAGES.register("dr_grpo")
def dr_grpo_advantages(rewards: Tensor, group_size: int, *, scored: Tensor | None = None) -> Tensor:
    """Dr. GRPO (no std): A_i = r_i - mean_g r. [B] -> [B]"""
    groups = as_groups(rewards, group_size)  # [P, G]
    mask = as_mask(scored, groups)
    return center_groups(groups, group_mean(groups, mask), mask).reshape(-1)


@ADVANTAGES.register("batch_std")
def batch_std_advantages(
    rewards: Tensor, group_size: int, *, eps: float = 1e-6, scored: Tensor | None = None
) -> Tensor:
    """A_i = (r_i - mean_g r) / (std of all B rewards (Bessel) + eps). [B] -> [B]

    TRL ``scale_rewards="batch"`` (TRL's eps is 1e-4). The std is over the raw rewards, not
    the centred ones; a batch of one row has std 0 and advantage 0.
    """
    groups = as_groups(rewards, group_size)  # [P, G]
    mask = as_mask(scored, groups)
    centred = center_groups(groups, group_mean(groups, mask), mask)
    return (centred / (bessel_std(groups, mask=mask) + eps)).reshape(-1)


@ADVANTAGES.register("rloo")
def rloo_advantages(rewards: Tensor, group_size: int, *, scored: Tensor | None = None) -> Tensor:
    """RLOO: A_i = r_i - mean_{j != i} r_j = G/(G-1) * (r_i - mean_g r); G = 1 -> 0. [B] -> [B]

    With ``scored``, G is the group's number n of scored completions (the others are no one's baseline).
    """
    groups = as_groups(rewards, group_size)  # [P, G]
    if group_size == 1:
        return torch.zeros_like(groups).reshape(-1)
    mask = as_mask(scored, groups)
    centred = center_groups(groups, group_mean(groups, mask), mask)
    n = torch.full_like(groups[:, :1], group_size) if mask is None else mask.sum(dim=1, keepdim=True).float()
    return (centred * (n / (n - 1).clamp(min=1))).reshape(-1)


@ADVANTAGES.register("reinforce_pp_baseline")
def reinforce_pp_baseline_advantages(
    rewards: Tensor, group_size: int, *, eps: float = 1e-6, scored: Tensor | None = None
) -> Tensor:
    """REINFORCE++ with baseline: x_i = r_i - mean_g r, A = (x - mean(x)) / (std(x) + eps).

    The whitening is over all B completions (verl ``reinforce_plus_plus_baseline`` whitens
    over tokens). All-equal groups give exactly 0 (mean(x) is 0 up to rounding, so this only
    removes float noise). [B] -> [B]
    """
    groups = as_groups(rewards, group_size)  # [P, G]
    mask = as_mask(scored, groups)
    x = center_groups(groups, group_mean(groups, mask), mask).reshape(-1)  # [B]
    included = None if mask is None else mask.reshape(-1)  # the batch statistics skip unscored rows
    return whiten_signal(x, constant_rows(groups, mask), eps, included)


@ADVANTAGES.register("opo")
def opo_advantages(rewards: Tensor, group_size: int, *, lengths: Tensor, scored: Tensor | None = None) -> Tensor:
    """OPO (arXiv 2505.23585; verl ``opo``): A_i = r_i - sum_g(|o_j| r_j) / sum_g |o_j|. [B] -> [B]

    ``lengths`` [B]: completion lengths |o_i| (tokens that enter the loss). The length-weighted
    mean is the optimal baseline of an exactly on-policy gradient with token-sum losses. A group
    whose lengths sum to 0 uses the plain mean.
    """
    groups = as_groups(rewards, group_size)  # [P, G]
    mask = as_mask(scored, groups)
    lens = as_groups(torch.as_tensor(lengths, device=rewards.device), group_size)  # [P, G]
    if mask is not None:
        lens = lens * mask  # unscored completions weigh nothing in the baseline
    total = lens.sum(dim=1, keepdim=True)  # [P, 1]
    weighted = (lens * groups).sum(dim=1, keepdim=True) / total.clamp(min=1e-12)
    baseline = torch.where(total > 0, weighted, group_mean(groups, mask))
    return center_groups(groups, baseline, mask).reshape(-1)


opo_advantages.needs_lengths = True


@ADVANTAGES.register("gpg")
def gpg_advantages(rewards: Tensor, group_size: int, *, f_norm: float = 1.0, scored: Tensor | None = None) -> Tensor:
    """GPG (arXiv 2504.02546; verl ``gpg``): A_i = alpha (r_i - mean_g) / f_norm. [B] -> [B]

    alpha = B / max(1, number of non-zero rewards in the batch): when few completions earn
    anything, the group-relative signal is scaled up (verl; ``f_norm`` 1.0 as verl). With ``scored``, B
    and the count are over the scored completions.
    """
    if f_norm <= 0:
        raise ValueError(f"f_norm must be > 0, got {f_norm}")
    groups = as_groups(rewards, group_size)  # [P, G]
    mask = as_mask(scored, groups)
    if mask is None:
        alpha = groups.numel() / torch.count_nonzero(groups).clamp(min=1)
    else:
        alpha = mask.sum() / torch.count_nonzero(groups * mask).clamp(min=1)
    return (alpha * center_groups(groups, group_mean(groups, mask), mask) / f_norm).reshape(-1)


def _inverted_cdf_quantile(groups: Tensor, quantile: float, mask: Tensor | None = None) -> Tensor:
    """Empirical K-quantile inf{r : F_G(r) >= K} per row: sorted[ceil(K*G) - 1], over the n scored values
    of the row with ``mask`` (sorted[ceil(K*n) - 1]). [P, G] -> [P, 1]"""
    size = groups.shape[1]
    if mask is None:
        index = min(max(math.ceil(round(quantile * size, 9)) - 1, 0), size - 1)
        return groups.sort(dim=1).values[:, index : index + 1]
    n = mask.sum(dim=1, keepdim=True).double()  # [P, 1]
    index = (torch.ceil(torch.round(quantile * n, decimals=9)) - 1).clamp(min=0)
    index = torch.minimum(index, (n - 1).clamp(min=0)).long()  # [P, 1]
    return torch.where(mask, groups, torch.inf).sort(dim=1).values.gather(1, index)  # unscored sort last


def _torch_quantile(interpolation: str):
    def fn(groups: Tensor, quantile: float, mask: Tensor | None = None) -> Tensor:
        if mask is None:
            return torch.quantile(groups, quantile, dim=1, keepdim=True, interpolation=interpolation)
        values = torch.where(mask, groups, torch.nan)  # nanquantile skips the unscored
        return torch.nanquantile(values, quantile, dim=1, keepdim=True, interpolation=interpolation)

    return fn


_QUANTILE_FNS = {"inverted_cdf": _inverted_cdf_quantile} | {
    name: _torch_quantile(name) for name in ("linear", "lower", "higher", "midpoint", "nearest")
}


@ADVANTAGES.register("qae")
def qae_advantages(
    rewards: Tensor,
    group_size: int,
    *,
    quantile: float = 0.4,
    interpolation: QuantileInterpolation = "inverted_cdf",
    scale_by_std: bool = False,
    eps: float = 1e-6,
    scored: Tensor | None = None,
) -> Tensor:
    """Quantile Advantage Estimation (Wu et al., arXiv 2509.22611): A_i = r_i - q_K(group).

    With ``scale_by_std``: A_i = (r_i - q_K) / (std_g + eps). [B] -> [B]

    quantile K = 0.4 is the value of the authors' released run scripts
    (``algorithm.quantile_k=0.4``, github.com/junkangwu/QAE). ``interpolation="inverted_cdf"``
    (default) is the K-quantile of the group's empirical distribution, q_K = inf{r : F(r) >= K}
    = sorted[ceil(K*G) - 1], always one of the rewards. With 0/1 rewards and success rate p it
    gives exactly the paper's two-regime gate: p <= 1-K -> q_K = 0, only successes get
    advantage; p > 1-K -> q_K = 1, only failures do. The authors' code calls
    ``torch.quantile(scores, K)`` (``interpolation="linear"``), which can put the baseline
    between 0 and 1 and give both successes and failures nonzero advantage; pass "linear"
    (or any other ``torch.quantile`` interpolation) to reproduce it. Their code then divides by
    the group std when verl's ``norm_adv_by_std_in_grpo`` is on (``scale_by_std=True`` here).
    """
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {quantile}")
    if interpolation not in _QUANTILE_FNS:
        raise ValueError(f"unknown interpolation {interpolation!r}; valid: {', '.join(_QUANTILE_FNS)}")
    groups = as_groups(rewards, group_size)  # [P, G]
    mask = as_mask(scored, groups)
    if scale_by_std:
        check_std_group("qae", rewards, group_size)
    centred = center_groups(groups, _QUANTILE_FNS[interpolation](groups, quantile, mask), mask)  # [P, G]
    if scale_by_std:
        centred = centred / (bessel_std(groups, dim=1, mask=mask) + eps)
    return centred.reshape(-1)


# ----------------------------------------------------------------------------------------------
# multi-reward aggregation: fn(rewards [B, R], weights [R], group_size, estimator, **p) -> [B]
# ----------------------------------------------------------------------------------------------
def _check_multi(rewards: Tensor, weights: Tensor | Sequence[float]) -> tuple[Tensor, Tensor]:
    if rewards.dim() != 2:
        raise ValueError(f"multi-reward rewards must be [B, R], got shape {tuple(rewards.shape)}")
    weights = torch.as_tensor(weights, dtype=torch.float32, device=rewards.device)
    if weights.shape != (rewards.shape[1],):
        raise ValueError(f"weights must have shape [R]=({rewards.shape[1]},), got {tuple(weights.shape)}")
    return rewards.to(torch.float32), weights


@REWARD_AGGREGATIONS.register("sum_then_normalize")
def sum_then_normalize(
    rewards: Tensor,
    weights: Tensor | Sequence[float],
    group_size: int,
    estimator: str = "grpo",
    *,
    scored: Tensor | None = None,
    **estimator_params,
) -> Tensor:
    """A = estimator(sum_k w_k r[:, k]): weight the rewards, then normalise. [B, R] -> [B]

    TRL ``multi_objective_aggregation="sum_then_normalize"`` (its default). ``scored`` [B] bool (None =
    all): the rows no reward function scored are left out of the estimator's statistics and get 0.
    """
    rewards, weights = _check_multi(rewards, weights)
    fn = _resolve_estimator(estimator, scored, estimator_params)
    return fn(rewards @ weights, group_size, **estimator_params)


@REWARD_AGGREGATIONS.register("normalize_then_sum")
def normalize_then_sum(
    rewards: Tensor,
    weights: Tensor | Sequence[float],
    group_size: int,
    estimator: str = "grpo",
    *,
    batch_normalize: bool = True,
    batch_eps: float = 1e-6,
    scored: Tensor | None = None,
    **estimator_params,
) -> Tensor:
    """GDPO (arXiv 2601.05242): normalise each reward in its group, then sum. [B, R] -> [B]

        S_i = sum_k w_k * estimator(r[:, k])_i
        A   = (S - mean(S)) / (std(S) + batch_eps)   over the batch, if ``batch_normalize``

    The final batch whitening is the GDPO paper's and TRL's ``normalize_then_sum`` (TRL's eps
    is 1e-4); ``batch_normalize=False`` returns the plain weighted sum S. Departure: a group whose
    every reward function is constant keeps A = 0 exactly (the paper's formula gives it
    -mean(S) / std(S): float noise for the centring estimators, a shift for ``qae``). ``scored`` [B]
    bool (None = all): the rows no reward function scored are left out of every per-reward estimate and
    of the batch whitening, and get 0 (TRL).
    """
    rewards, weights = _check_multi(rewards, weights)
    fn = _resolve_estimator(estimator, scored, estimator_params)
    per_reward = [fn(rewards[:, k], group_size, **estimator_params) for k in range(rewards.shape[1])]
    total = (torch.stack(per_reward, dim=1) * weights).sum(dim=1)  # [B]
    if not batch_normalize:
        return total
    columns = [as_groups(rewards[:, k], group_size) for k in range(rewards.shape[1])]  # R x [P, G]
    mask = None if scored is None or not columns else as_mask(scored, columns[0])
    constant = torch.stack([constant_rows(groups, mask) for groups in columns]).all(0)  # [B]
    return whiten_signal(total, constant, batch_eps, None if mask is None else mask.reshape(-1))


def _resolve_estimator(name: str, scored: Tensor | None, params: dict):
    """The ``ADVANTAGES`` entry ``name``; with ``scored`` set, put into ``params`` for it (an estimator
    that cannot leave unscored rows out, not marked ``takes_scored``, raises instead)."""
    fn = ADVANTAGES.get(name)
    if scored is not None:
        if not getattr(fn, "takes_scored", False):
            raise ValueError(
                f"advantage estimator {name!r} cannot leave out the samples no reward function scored "
                "(it is not marked takes_scored): set model.algorithm.unscored: zero to score them 0"
            )
        params["scored"] = scored
    return fn


# Read by the run plan's checks (lightning_grpo.plan.run_plan) instead of branching on names: each of
# these estimators compares a completion with the others of its group, so it needs G >= 2 to give
# any signal; grpo also divides by the group's reward std. A custom estimator may set them too.
for _estimator in (
    grpo_advantages,
    dr_grpo_advantages,
    batch_std_advantages,
    rloo_advantages,
    reinforce_pp_baseline_advantages,
    qae_advantages,
    opo_advantages,
    gpg_advantages,
):
    _estimator.group_relative = True
    _estimator.takes_scored = True  # leaves unscored rows (``scored``) out of its group statistics
grpo_advantages.divides_by_group_std = True
