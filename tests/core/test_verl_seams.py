"""Seams between our compositions and verl's own functions: hand-computed numbers that
pin where the composed loss must agree with verl (geo_mean's IS weight, IcePop-style MIS and its
batch normalisation, one ratio direction for every rejection criterion, DPPO's clip fractions)."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_grpo.core import REJECTIONS, GRPOLoss, OffPolicySettings
from lightning_grpo.core.trust_region_losses import dppo_tv_loss

L2, L3, L10 = math.log(2.0), math.log(3.0), math.log(10.0)


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


# ------------------------------------------------------------------ geo_mean with IS weights
def test_geo_mean_scales_a_row_by_the_geometric_mean_of_its_is_weights():
    """verl compute_policy_loss_geo_mean: seq weight = exp(mean_t log w_t). Weights [2, 0.5]:
    geometric mean 1, so L = -A s = -1.0 (the arithmetic mean 1.25 would give -1.25)."""
    zeros = torch.zeros(1, 2)
    roll = torch.tensor([[-L2, L2]])  # old - roll = [log 2, -log 2]: w = [2, 0.5]
    loss = GRPOLoss(
        policy_loss="geo_mean", off_policy=OffPolicySettings(correction="tis_token", correction_args={"cap": 10.0})
    )
    out = loss(zeros.clone().requires_grad_(), torch.ones(1, 2), torch.tensor([1.0]), old_logp=zeros, rollout_logp=roll)
    close(out.loss, -1.0)
    # two rows with padding: row 1 weights [4, 1] (geo mean 2, A = -0.5: L = +1.0); mean over rows (-1 + 1) / 2
    old = torch.zeros(2, 3)
    roll = torch.tensor([[-L2, L2, 0.0], [-2 * L2, 0.0, 5.0]])  # the padded entry must not count
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    out = loss(old.clone().requires_grad_(), mask, torch.tensor([1.0, -0.5]), old_logp=old, rollout_logp=roll)
    close(out.loss, 0.0)


# --------------------------------------------------------- MIS: zero weight, as verl's IcePop
def _mis(correction, roll, adv, *, aggregation="token_mean", normalize=False, **args):
    zeros = torch.zeros_like(roll)
    loss = GRPOLoss(
        aggregation=aggregation,
        off_policy=OffPolicySettings(correction=correction, correction_args=args, is_batch_normalize=normalize),
    )
    return loss(zeros.clone().requires_grad_(), torch.ones_like(roll), adv, old_logp=zeros, rollout_logp=roll)


def test_mis_token_outside_the_band_is_a_zero_weight_counted_by_the_normalisers():
    """verl IcePop (rollout_is_threshold "lower_upper"): w = 0 outside the band, the token stays in the
    token-mean denominator and in the batch-normalisation mean. One row, rho = [1, 10], band [0.5, 5],
    A = 1, r = 1 (every token's PPO loss -1): weights [1, 0] -> token mean (-1 + 0) / 2 = -0.5;
    normalised by their mean 0.5 -> [2, 0] -> -1.0."""
    roll = torch.tensor([[0.0, -L10]])
    adv = torch.tensor([1.0])
    close(_mis("mis_token", roll, adv, low=0.5, high=5.0).loss, -0.5)
    out = _mis("mis_token", roll, adv, normalize=True, low=0.5, high=5.0)
    close(out.loss, -1.0)
    close(out.metrics["is_batch_norm_factor"], 0.5)
    close(out.metrics["is_frac_masked"], 0.5)
    # seq_mean_token_mean, two rows: rho [2, 10] and [1, 1]; weights [2, 0], [1, 1], mean over all four 1.0
    # row 0: (-2 + 0) / 2 = -1, row 1: (-1 - 1) / 2 = -1 -> -1.0 (the mean over kept tokens, 4/3, gave -1.125)
    roll = torch.tensor([[-L2, -L10], [0.0, 0.0]])
    out = _mis(
        "mis_token",
        roll,
        torch.tensor([1.0, 1.0]),
        aggregation="seq_mean_token_mean",
        normalize=True,
        low=0.5,
        high=5.0,
    )
    close(out.loss, -1.0)


def test_mis_seq_zero_weight_rows_stay_in_the_normalisers():
    """Sequence level: row 0 rho = 10 > high 3 (weight 0), row 1 rho = 2. Token mean over both rows'
    tokens: (0 - 2) / 2 = -1.0; normalised by the row mean (0 + 2) / 2 = 1: the same -1.0."""
    roll = torch.tensor([[-L10], [-L2]])
    adv = torch.tensor([1.0, 1.0])
    close(_mis("mis_seq", roll, adv).loss, -1.0)
    out = _mis("mis_seq", roll, adv, normalize=True)
    close(out.loss, -1.0)
    close(out.metrics["is_batch_norm_factor"], 1.0)


def test_a_given_global_is_weight_mean_replaces_the_local_one():
    """is_weight_mean (the statistic of the whole optimizer-step batch, computed once by the trainer)
    is what the weights are divided by: weights [2, 2] / 4 -> 0.5, token mean of -0.5 = -0.5."""
    zeros = torch.zeros(1, 2)
    loss = GRPOLoss(
        off_policy=OffPolicySettings(correction="tis_token", correction_args={"cap": 10.0}, is_batch_normalize=True)
    )
    roll = torch.tensor([[-L2, -L2]])
    out = loss(
        zeros.clone().requires_grad_(),
        torch.ones(1, 2),
        torch.tensor([1.0]),
        old_logp=zeros,
        rollout_logp=roll,
        is_weight_mean=torch.tensor(4.0),
    )
    close(out.loss, -0.5)
    close(out.metrics["is_batch_norm_factor"], 4.0)
    # the statistic the trainer sums over micro-batches and ranks: (sum of weights, count)
    close(loss.is_weight_sums(zeros, roll, torch.ones(1, 2)), [4.0, 2.0])


# --------------------------------------------------------------- one ratio direction for all
@pytest.mark.parametrize("name", ["token_k1", "seq_sum_k1", "seq_mean_k1", "geo_mask", "outlier_veto"])
def test_every_ratio_criterion_bounds_pi_old_over_pi_roll(name):
    """Bounds [0.5, 4] are asymmetric. Row 0: rho = pi_old / pi_roll = 3 (inside), row 1: rho = 1/3
    (outside). Every criterion keeps row 0 and rejects row 1 (before: token_k1 / seq_*_k1 bounded
    pi_roll / pi_old and did the opposite)."""
    d = torch.tensor([[L3], [-L3]])  # old - roll
    assert REJECTIONS.get(name)(d, torch.ones(2, 1), [0.5, 4.0]).tolist() == [[True], [False]]


# ------------------------------------------------------------------------- DPPO clip fractions
def test_dppo_clip_frac_dual_counts_as_verls_pg_clipfrac_lower():
    """verl dppo_tv: pg_clipfrac_lower = mean((r > c) * valid): truncated ratios among the tokens that
    train (inside the trust region). c = 1.5, delta 0.15; tokens (p_old -> p, A):
    0.1 -> 0.2 (A > 0, inside, r = 2: counted), 0.1 -> 0.5 (A > 0, outside, r = 5: not counted),
    0.5 -> 0.5 (inside, r = 1), 0.2 -> 0.4 (A < 0, inside: p rose, r = 2: counted): 2 / 4."""
    old = torch.log(torch.tensor([[0.1, 0.1, 0.5, 0.2]]))
    logp = torch.log(torch.tensor([[0.2, 0.5, 0.5, 0.4]]))
    adv = torch.tensor([[1.0, 1.0, 1.0, -1.0]])
    out = dppo_tv_loss(logp, old, adv, torch.ones(1, 4), clip_ratio_c=1.5)
    close(out.metrics["clip_frac_dual"], 0.5)
    close(out.metrics["clip_frac_high"], 0.25)  # the token outside the region (verl pg_clipfrac = high + low)
    close(out.metrics["clip_frac_low"], 0.0)
