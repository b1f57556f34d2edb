"""Rollout rejection criteria, IS-weight batch normalisation and bypass mode."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_grpo.core import REJECTIONS, GRPOLoss, OffPolicySettings
from lightning_grpo.core.corrections import normalize_is_weight
from lightning_grpo.core.rejection import check_rejection, rejection_mask

L3, L15 = math.log(3.0), math.log(1.5)


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


def keep(name, d, mask=None, threshold=None):
    d = torch.as_tensor(d, dtype=torch.float32)
    mask = torch.ones_like(d) if mask is None else torch.as_tensor(mask, dtype=torch.float32)
    return REJECTIONS.get(name)(d, mask, threshold).tolist()


# ---------------------------------------------------------------------------------- by hand
def test_token_criteria_by_hand():
    # d = old - roll; the bounded ratio rho = pi_old / pi_roll = exp(d) = [1, 3, 1/3, 3/2]
    assert keep("token_k1", [[0.0, L3, -L3, L15]], threshold=2.0) == [[True, False, False, True]]  # [0.5, 2]
    assert keep("token_k1", [[0.0, L3, -L3, L15]], threshold=[0.25, 1.0]) == [[True, False, True, False]]
    assert keep("token_k2", [[0.2, -0.5, 0.4]], threshold=0.1) == [[True, False, True]]  # k2 = .02 .125 .08
    k3 = [math.exp(d) - 1 - d for d in (0.2, -0.5, 0.4)]  # 0.0214, 0.1065, 0.0918
    assert keep("token_k3", [[0.2, -0.5, 0.4]], threshold=0.1) == [[k <= 0.1 for k in k3]] == [[True, False, True]]


def test_sequence_criteria_by_hand():
    d = [[0.3, 0.3, 0.3], [0.3, -0.2, 0.0]]
    mask = [[1, 1, 1], [1, 1, 0]]
    # seq_sum_k1: prod rho = exp(0.9) = 2.46 > 2 drops row 0; exp(0.1) = 1.11 keeps row 1 (padding stays False)
    assert keep("seq_sum_k1", d, mask, 2.0) == [[False] * 3, [True, True, False]]
    # seq_mean_k1: exp(0.3) = 1.35 and exp(0.05): both kept with [0.5, 2]; [0.8, 1.25] drops row 0
    assert keep("seq_mean_k1", d, mask, 2.0) == [[True] * 3, [True, True, False]]
    assert keep("seq_mean_k1", d, mask, [0.8, 1.25]) == [[False] * 3, [True, True, False]]
    # seq_sum_k2 = 0.135 / 0.065; seq_mean_k2 = 0.045 / 0.0325; seq_max_k2 = 0.045 / 0.045
    assert keep("seq_sum_k2", d, mask, 0.1) == [[False] * 3, [True, True, False]]
    assert keep("seq_mean_k2", d, mask, 0.04) == [[False] * 3, [True, True, False]]
    assert keep("seq_max_k2", d, mask, 0.044) == [[False] * 3, [False] * 3]

    def k3(x):
        return math.exp(x) - 1 - x

    assert keep("seq_max_k3", d, mask, k3(0.3) + 1e-6) == [[True] * 3, [True, True, False]]
    assert keep("seq_sum_k3", d, mask, 2 * k3(0.3)) == [[False] * 3, [True, True, False]]


def test_geo_mask_and_outlier_veto_by_hand():
    d = [[0.005, 0.005], [0.02, 0.02], [-0.02, 0.02]]
    assert keep("geo_mask", d) == [[True, True], [False, False], [True, True]]  # exp(mean) in [0.99, 1.01]
    assert keep("geo_mask", d, threshold=[0.9, None]) == [[True, True]] * 3
    veto = [[0.0, math.log(1e-5)], [0.0, math.log(200.0)], [0.0, math.log(50.0)]]
    assert keep("outlier_veto", veto) == [[False, False], [False, False], [True, True]]  # [1e-4, 100]
    assert keep("outlier_veto", veto, threshold=[None, 1000.0]) == [[True, True], [True, True], [True, True]]


def test_several_criteria_at_once_and_their_fractions():
    old = torch.tensor([[0.0, L3, 0.0, 0.0], [0.65, 0.65, 0.0, 0.0]])
    roll = torch.zeros(2, 4)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    out = rejection_mask(old, roll, mask, {"token_k1": 2.0, "seq_mean_k2": 0.205})
    # token_k1 drops (0, 1) (ratio 3; exp(0.65) = 1.92 is inside [0.5, 2]); seq_mean_k2 is
    # L3^2 / 6 = 0.2012 on row 0 (kept) and 0.65^2 / 2 = 0.2113 on row 1 (dropped whole)
    close(out.keep, [[1, 0, 1, 0], [0, 0, 0, 0]])
    close(out.metrics["rejection/token_k1_masked_frac"], 1 / 5)
    close(out.metrics["rejection/seq_mean_k2_masked_frac"], 2 / 5)
    close(out.metrics["rejection_masked_frac"], 3 / 5)
    close(out.metrics["rejection_seq_masked_frac"], 1.0)


# --------------------------------------------------------------------------- loop reference
def _loop_keep(name, d, mask, threshold):
    stat, level = name.split("_")[-1], name.rsplit("_", 1)[0]
    out = []
    for row, mrow in zip(d.tolist(), mask.tolist()):
        vals = []
        for x, m in zip(row, mrow):
            x = max(-20.0, min(20.0, x))
            vals.append({"k1": -x, "k2": 0.5 * x * x, "k3": math.exp(x) - 1 - x}[stat] if m else None)
        valid = [v for v in vals if v is not None]
        if level == "token":
            # k1 bounds rho = pi_old / pi_roll = exp(-k1)
            ok = [
                v is not None
                and (math.log(threshold[0]) <= -v <= math.log(threshold[1]) if stat == "k1" else v <= threshold)
                for v in vals
            ]
        else:
            agg = {
                "seq_sum": sum,
                "seq_mean": lambda v: sum(v) / max(len(v), 1),
                "seq_max": lambda v: max(v) if v else 0.0,
            }[level](valid)
            row_ok = math.log(threshold[0]) <= -agg <= math.log(threshold[1]) if stat == "k1" else agg <= threshold
            ok = [row_ok and v is not None for v in vals]
        out.append(ok)
    return out


@pytest.mark.parametrize("name", [n for n in REJECTIONS.names() if n not in ("geo_mask", "outlier_veto")])
def test_vectorised_matches_loop(name):
    g = torch.Generator().manual_seed(7)
    d = 0.4 * torch.randn(6, 9, generator=g, dtype=torch.float64)
    mask = (torch.rand(6, 9, generator=g) > 0.3).double()
    mask[-1] = 0
    threshold = [0.7, 1.3] if name.endswith("k1") else 0.05
    got = REJECTIONS.get(name)(d, mask, threshold).tolist()
    assert got == _loop_keep(name, d, mask, threshold)


# ------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "criteria,message",
    [
        ({"token_k4": 1.0}, r"unknown rollout rejection criterion 'token_k4'; valid names: geo_mask"),
        ({"token_k2": -1.0}, r"rejection 'token_k2': a threshold must be a number > 0, got -1.0"),
        ({"token_k2": [0.1, 0.2]}, r"rejection 'token_k2' takes one upper bound"),
        ({"token_k1": [2.0, 0.5]}, r"rejection 'token_k1': lower bound 2.0 is above the upper bound 0.5"),
        ({"geo_mask": 1.01}, r"rejection 'geo_mask': give \[low, high\]"),
        ({}, r"rejection must map criterion names to thresholds"),
    ],
)
def test_bad_rejection_fails_at_construction(criteria, message):
    with pytest.raises(ValueError, match=message):
        GRPOLoss(off_policy=OffPolicySettings(rejection=criteria))
    with pytest.raises(ValueError, match=message):
        check_rejection(criteria)


# ------------------------------------------------------------------------ in the objective
def test_rejected_tokens_leave_the_loss_and_its_normaliser():
    torch.manual_seed(0)
    logp = (torch.randn(3, 4) * 0.3 - 1.0).requires_grad_()
    old = logp.detach().clone()
    roll = old.clone()
    roll[0, 1] -= 2.0  # ratio e^2 = 7.4: rejected by token_k1 [0.5, 2]
    roll[2] += 0.9  # the whole row off: seq_mean_k1 exp(-0.9) < 0.5
    mask = torch.ones(3, 4)
    adv = torch.tensor([1.0, -1.0, 0.5])
    loss = GRPOLoss(off_policy=OffPolicySettings(rejection={"token_k1": 2.0, "seq_mean_k1": 2.0}))
    out = loss(logp, mask, adv, old_logp=old, rollout_logp=roll)
    kept = torch.ones(3, 4)
    kept[0, 1] = 0
    kept[2] = 0
    expected = GRPOLoss()(logp, kept, adv, old_logp=old)  # the same loss on the kept tokens only
    close(out.loss, expected.loss)
    close(out.metrics["rejection_masked_frac"], 5 / 12)
    close(out.metrics["masked_frac"], 5 / 12)
    assert loss.masks_before_training and loss.needs_rollout_logprobs
    close(loss.static_keep_mask(old, roll, mask), kept)


def test_is_batch_normalisation_token_and_sequence_level():
    w = torch.tensor([[1.0, 2.0, 0.0], [0.5, 0.5, 0.5]])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    out, factor = normalize_is_weight(w, m, "token")  # token mean = 4.5 / 5 = 0.9
    close(factor, 0.9)
    close(out, [[1 / 0.9, 2 / 0.9, 0.0], [0.5 / 0.9] * 3])
    ws = torch.tensor([[2.0, 2.0, 0.0], [0.5, 0.5, 0.5]])
    out, factor = normalize_is_weight(ws, m, "sequence")  # sequence mean = (2 + 0.5) / 2 = 1.25
    close(factor, 1.25)
    close(out, [[1.6, 1.6, 0.0], [0.4] * 3])
    # in the objective: old - roll = log 2 on one row, 0 on the other, tis_token cap 3
    old = torch.zeros(2, 3)
    roll = torch.tensor([[-math.log(2.0)] * 3, [0.0] * 3])
    logp = torch.zeros(2, 3, requires_grad=True)
    res = GRPOLoss(
        off_policy=OffPolicySettings(correction="tis_token", correction_args={"cap": 3.0}, is_batch_normalize=True)
    )(logp, torch.ones(2, 3), torch.tensor([1.0, 1.0]), old_logp=old, rollout_logp=roll)
    close(res.metrics["is_batch_norm_factor"], 1.5)
    close(res.loss, -1.0)  # weights 4/3 and 2/3 average 1; PPO loss -A r = -1 on every token


def test_bypass_uses_the_engine_logprobs_as_old():
    torch.manual_seed(1)
    logp = (torch.randn(4, 5) * 0.3 - 1.0).requires_grad_()
    roll = logp.detach() + 0.25 * torch.randn(4, 5)
    mask = torch.ones(4, 5)
    mask[3, 2:] = 0
    adv = torch.tensor([1.0, -0.5, 0.3, -1.2])
    bypass = GRPOLoss(off_policy=OffPolicySettings(bypass=True))(logp, mask, adv, rollout_logp=roll)
    plain = GRPOLoss()(logp, mask, adv, old_logp=roll)
    close(bypass.loss, plain.loss, atol=0)
    assert "mismatch_k3" not in bypass.metrics  # no trainer-side old log-probs: nothing to compare with the engine
    # REINFORCE form: -min(pi / pi_roll, 2) A logp, token mean
    out = GRPOLoss(policy_loss="reinforce", off_policy=OffPolicySettings(bypass=True))(
        logp, mask, adv, rollout_logp=roll
    )
    w = torch.exp(logp.detach() - roll).clamp(max=2.0)
    close(out.loss, (-(w * adv[:, None] * logp.detach()) * mask).sum() / mask.sum())
    # rejection in bypass compares the current policy (no gradient) with the engine
    rej = GRPOLoss(off_policy=OffPolicySettings(bypass=True, rejection={"token_k1": [0.9, 1.1]}))(
        logp, mask, adv, rollout_logp=roll
    )
    inside = ((roll - logp.detach()).exp() >= 0.9) & ((roll - logp.detach()).exp() <= 1.1)
    close(rej.metrics["rejection_masked_frac"], ((~inside) & (mask > 0)).sum() / mask.sum())


def test_bypass_refuses_an_is_correction_and_needs_roll():
    with pytest.raises(
        ValueError,
        match=r"off_policy.bypass=True uses the engine's log-probs as old.* off_policy.correction must be None, got 'tis_token'",
    ):
        OffPolicySettings(bypass=True, correction="tis_token")
    with pytest.raises(ValueError, match=r"bypass / sequence_mask_delta need rollout_logp"):
        GRPOLoss(off_policy=OffPolicySettings(bypass=True))(torch.zeros(1, 2), torch.ones(1, 2), torch.zeros(1))
    assert not GRPOLoss(off_policy=OffPolicySettings(bypass=True, rejection={"token_k2": 1.0})).masks_before_training
    with pytest.raises(ValueError, match=r"bypass=True: the ratio already is pi / pi_roll, no correction can be added"):
        GRPOLoss(off_policy=OffPolicySettings(bypass=True)).set_correction(
            "tis_token"
        )  # what MismatchGuard's fix would do
