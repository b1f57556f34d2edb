"""Rollout corrections (TIS / MIS), the off-policy sequence mask and mismatch metrics."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from lightning_grpo.core.corrections import (
    CorrectionOutput,
    mis_seq,
    mis_token,
    mismatch_metrics,
    off_policy_sequence_mask,
    tis_seq,
    tis_seq_geo,
    tis_token,
)
from lightning_grpo.core.registry import CORRECTIONS, TOKEN_MASKS

NAN = float("nan")
NAMES = ["mis_seq", "mis_token", "tis_seq", "tis_seq_geo", "tis_token"]


def _t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_registered_names():
    assert CORRECTIONS.names() == NAMES
    assert "off_policy_sequence" in TOKEN_MASKS
    assert TOKEN_MASKS.get("off_policy_sequence") is off_policy_sequence_mask


def test_tis_token_truncation_by_hand():
    # old - roll = [0.5, -1.0, 0.0, 1.0], last column padding (nan in roll)
    old = _t([[-1.0, -2.0, -0.5, 0.0, -1.0]])
    roll = _t([[-1.5, -1.0, -0.5, -1.0, NAN]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    out = tis_token(old, roll, mask)  # cap 2.0
    assert isinstance(out, CorrectionOutput)
    assert_close(out.weight, _t([[math.exp(0.5), math.exp(-1.0), 1.0, 2.0, 0.0]]), atol=1e-6, rtol=0)
    assert_close(out.mask, _t([[1, 1, 1, 1, 0]]), atol=0, rtol=0)
    assert_close(out.metrics["is_frac_truncated"], torch.tensor(1 / 4), atol=1e-6, rtol=0)
    mean_w = (math.exp(0.5) + math.exp(-1.0) + 1.0 + 2.0) / 4
    assert_close(out.metrics["is_weight_mean"], torch.tensor(mean_w), atol=1e-6, rtol=0)
    out15 = tis_token(old, roll, mask, cap=1.5)
    assert_close(out15.weight, _t([[1.5, math.exp(-1.0), 1.0, 1.5, 0.0]]), atol=1e-6, rtol=0)


# Two sequences and an empty one. old - roll: row 0 = [0.3, 0.4, 0.5] (sum 1.2, mean 0.4),
# row 1 = [-0.2, -0.1, pad] (sum -0.3, mean -0.15), row 2 empty.
OLD = _t([[-1.0, -1.0, -1.0], [-2.0, -2.0, 0.0], [0.0, 0.0, 0.0]])
ROLL = _t([[-1.3, -1.4, -1.5], [-1.8, -1.9, NAN], [NAN, NAN, NAN]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 0, 0]])


@pytest.mark.parametrize("correction", [tis_token, tis_seq, tis_seq_geo])
def test_a_ratio_equal_to_the_cap_is_not_counted_as_truncated(correction):
    """is_frac_truncated counts rho > cap only: identical log-probs give rho = 1 exactly, and with cap = 1
    every weight is 1 (the cap) and nothing is truncated; one token above the cap is."""
    logp = _t([[-1.0, -2.0], [-0.5, -0.25]])
    mask = torch.ones(2, 2)
    out = correction(logp, logp, mask, cap=1.0)
    assert_close(out.weight, torch.ones(2, 2), atol=0, rtol=0)
    assert_close(out.metrics["is_frac_truncated"], torch.tensor(0.0), atol=0, rtol=0)
    above = correction(logp + _t([[0.0, 0.0], [0.5, 0.5]]), logp, mask, cap=1.0)
    assert_close(above.metrics["is_frac_truncated"], torch.tensor(0.5), atol=1e-6, rtol=0)


def test_tis_seq_product_vs_geometric_mean():
    prod = tis_seq(OLD, ROLL, MASK, cap=3.0)
    geo = tis_seq_geo(OLD, ROLL, MASK, cap=3.0)
    # product: exp(1.2) = 3.32 -> truncated to 3; exp(-0.3) = 0.741
    w0, w1 = 3.0, math.exp(-0.3)
    assert_close(prod.weight, _t([[w0, w0, w0], [w1, w1, 0.0], [0.0, 0.0, 0.0]]), atol=1e-6, rtol=0)
    # geometric mean: exp(0.4) = 1.49, exp(-0.15) = 0.861, neither truncated
    g0, g1 = math.exp(0.4), math.exp(-0.15)
    assert_close(geo.weight, _t([[g0, g0, g0], [g1, g1, 0.0], [0.0, 0.0, 0.0]]), atol=1e-6, rtol=0)
    # truncated fraction over the 2 non-empty sequences
    assert_close(prod.metrics["is_frac_truncated"], torch.tensor(0.5), atol=1e-6, rtol=0)
    assert_close(geo.metrics["is_frac_truncated"], torch.tensor(0.0), atol=1e-6, rtol=0)
    assert_close(prod.mask, MASK.float(), atol=0, rtol=0)
    # default cap 2.0
    assert_close(tis_seq(OLD, ROLL, MASK).weight[0], _t([2.0, 2.0, 2.0]), atol=1e-6, rtol=0)


def test_mis_token_masks_outside_band_and_keeps_ratio_inside():
    # rho = [exp(0.5)=1.65 in, exp(-1)=0.37 < 0.5, exp(2)=7.39 > 5, exp(0)=1 in], padding last
    old = _t([[-1.0, -2.0, 0.0, -0.5, 0.0]])
    roll = _t([[-1.5, -1.0, -2.0, -0.5, NAN]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    out = mis_token(old, roll, mask)  # low 0.5, high 5.0
    assert_close(out.weight, _t([[math.exp(0.5), 0.0, 0.0, 1.0, 0.0]]), atol=1e-6, rtol=0)
    assert_close(out.mask, _t([[1, 0, 0, 1, 0]]), atol=0, rtol=0)
    assert_close(out.metrics["is_frac_masked"], torch.tensor(2 / 4), atol=1e-6, rtol=0)
    assert_close(out.metrics["is_weight_mean"], torch.tensor((math.exp(0.5) + 1.0) / 2), atol=1e-6, rtol=0)
    # no lower bound: the 0.37 token is kept with its ratio
    out2 = mis_token(old, roll, mask, low=None, high=2.0)
    assert_close(out2.weight, _t([[math.exp(0.5), math.exp(-1.0), 0.0, 1.0, 0.0]]), atol=1e-6, rtol=0)


def test_mis_seq_masks_whole_sequences():
    out = mis_seq(OLD, ROLL, MASK)  # low None, high 3.0: row 0 product 3.32 > 3 -> masked
    w1 = math.exp(-0.3)
    assert_close(out.mask, _t([[0, 0, 0], [1, 1, 0], [0, 0, 0]]), atol=0, rtol=0)
    assert_close(out.weight, _t([[0, 0, 0], [w1, w1, 0], [0, 0, 0]]), atol=1e-6, rtol=0)
    assert_close(out.metrics["is_frac_masked"], torch.tensor(0.5), atol=1e-6, rtol=0)
    # lower bound 0.8 > 0.741 masks row 1 too; a band containing both keeps both with their ratios
    assert mis_seq(OLD, ROLL, MASK, low=0.8).mask.sum().item() == 0.0
    both = mis_seq(OLD, ROLL, MASK, low=0.5, high=4.0)
    assert_close(both.weight[0], _t([math.exp(1.2)] * 3), atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", NAMES)
def test_plus_minus_100_log_ratios_are_finite(name):
    old = _t([[0.0, 0.0, 0.0], [-100.0, -100.0, -100.0]])
    roll = _t([[-100.0, -100.0, -100.0], [0.0, 0.0, 0.0]])  # +100 and -100 per token
    mask = torch.ones(2, 3)
    out = CORRECTIONS.get(name)(old, roll, mask)
    assert torch.isfinite(out.weight).all() and torch.isfinite(out.mask).all()
    assert all(torch.isfinite(v) for v in out.metrics.values())
    assert out.weight.max() <= math.exp(20.0) * (1 + 1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_weight_is_detached_float32_and_bf16_ok(name):
    old = OLD.clone().requires_grad_(True)
    out = CORRECTIONS.get(name)(old, ROLL, MASK)
    assert not out.weight.requires_grad and not out.mask.requires_grad
    assert out.weight.dtype == torch.float32
    out16 = CORRECTIONS.get(name)(OLD.to(torch.bfloat16), ROLL.to(torch.bfloat16), MASK.bool())
    ref = CORRECTIONS.get(name)(OLD.to(torch.bfloat16).float(), ROLL.to(torch.bfloat16).float(), MASK)
    assert out16.weight.dtype == torch.float32
    assert_close(out16.weight, ref.weight, atol=1e-6, rtol=0)


def test_invalid_parameters():
    with pytest.raises(ValueError):
        tis_token(OLD, ROLL, MASK, cap=0.0)
    with pytest.raises(ValueError):
        mis_token(OLD, ROLL, MASK, low=3.0, high=2.0)


def _clamp(x):
    return min(max(x, -20.0), 20.0)


def _loop_corrections(name, old, roll, mask, params):
    w_rows, m_rows = [], []
    for o_row, r_row, m_row in zip(old.tolist(), roll.tolist(), mask.tolist()):
        diffs = [o - r for o, r, m in zip(o_row, r_row, m_row) if m]
        n = len(diffs)
        clamp = _clamp
        if name == "tis_token":
            it = iter(diffs)
            w = [min(math.exp(clamp(next(it))), params["cap"]) if m else 0.0 for m in m_row]
            keep = [float(m) for m in m_row]
        elif name in ("tis_seq", "tis_seq_geo"):
            s = sum(diffs) if name == "tis_seq" else (sum(diffs) / n if n else 0.0)
            ws = min(math.exp(clamp(s)), params["cap"])
            w = [ws if m else 0.0 for m in m_row]
            keep = [float(m) for m in m_row]
        elif name == "mis_token":
            it = iter(diffs)
            w, keep = [], []
            for m in m_row:
                rho = math.exp(clamp(next(it))) if m else 0.0
                ok = bool(m) and params["low"] <= rho <= params["high"]
                w.append(rho if ok else 0.0)
                keep.append(1.0 if ok else 0.0)
        else:  # mis_seq
            rho = math.exp(clamp(sum(diffs)))
            ok = params["low"] <= rho <= params["high"]
            w = [rho if (m and ok) else 0.0 for m in m_row]
            keep = [1.0 if (m and ok) else 0.0 for m in m_row]
        w_rows.append(w)
        m_rows.append(keep)
    return torch.tensor(w_rows), torch.tensor(m_rows)


@pytest.mark.parametrize("name", NAMES)
def test_matches_loop_reference(name):
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(8, 6, generator=g) * 3
    roll = old + 0.4 * torch.randn(8, 6, generator=g)
    lengths = torch.tensor([6, 0, 1, 3, 5, 2, 6, 4])
    mask = (torch.arange(6)[None, :] < lengths[:, None]).float()
    params = {"cap": 1.3} if name.startswith("tis") else {"low": 0.8, "high": 1.25}
    out = CORRECTIONS.get(name)(old, roll, mask, **params)
    w, keep = _loop_corrections(name, old, roll, mask, params)
    assert_close(out.weight, w, atol=1e-6, rtol=1e-6)
    assert_close(out.mask, keep, atol=0, rtol=0)


def test_off_policy_sequence_mask_cases():
    # drift_i = mean_t(roll - logp) over valid tokens
    logp = _t([[-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0], [0.0, 0.0], [-1.0, -1.0]])
    roll = _t([[-0.6, -0.4], [-0.6, -0.4], [-0.9, -0.9], [-0.6, -0.4], [NAN, NAN], [-0.7, NAN]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 1], [1, 1], [0, 0], [1, 0]])
    adv = torch.tensor([-1.0, 1.0, -1.0, 0.0, -1.0, -0.5])
    # drifts: (0.4+0.6)/2 = 0.5, 0.5, 0.1, 0.5, empty -> 0, 0.3 (== delta: kept, rule is strict >)
    keep = off_policy_sequence_mask(logp, roll, adv, mask, delta=0.3)
    assert_close(keep, _t([0.0, 1.0, 1.0, 1.0, 1.0, 1.0]), atol=0, rtol=0)
    # a looser threshold keeps everything
    assert_close(off_policy_sequence_mask(logp, roll, adv, mask, delta=0.6), torch.ones(6), atol=0, rtol=0)


def test_off_policy_sequence_mask_detaches_and_per_token_advantages():
    logp = _t([[-1.0, -1.0], [-1.0, -1.0]]).requires_grad_(True)
    roll = _t([[-0.5, -0.5], [-0.5, -0.5]])  # drift 0.5 on both
    mask = torch.ones(2, 2)
    adv_tok = _t([[-1.0, -1.0], [2.0, -1.0]])  # row means -1 (drop) and 0.5 (keep)
    keep = off_policy_sequence_mask(logp, roll, adv_tok, mask, delta=0.1)
    assert not keep.requires_grad and keep.dtype == torch.float32
    assert_close(keep, _t([0.0, 1.0]), atol=0, rtol=0)
    keep16 = off_policy_sequence_mask(logp.detach().bfloat16(), roll.bfloat16(), adv_tok[:, 0], mask.bool(), 0.1)
    assert_close(keep16, _t([0.0, 1.0]), atol=0, rtol=0)


def test_off_policy_sequence_mask_loop_reference():
    g = torch.Generator().manual_seed(2)
    logp = -torch.rand(16, 5, generator=g) * 2
    roll = logp + 0.5 * torch.randn(16, 5, generator=g)
    adv = torch.randn(16, generator=g)
    mask = (torch.rand(16, 5, generator=g) > 0.3).float()
    keep = off_policy_sequence_mask(logp, roll, adv, mask, delta=0.1)
    expected = []
    for lp, r, m, a in zip(logp.tolist(), roll.tolist(), mask.tolist(), adv.tolist()):
        vals = [ri - li for li, ri, mi in zip(lp, r, m) if mi]
        drift = sum(vals) / len(vals) if vals else 0.0
        expected.append(0.0 if (a < 0 and drift > 0.1) else 1.0)
    assert_close(keep, torch.tensor(expected), atol=0, rtol=0)


def test_mismatch_metrics_by_hand():
    old = _t([[-1.0, -2.0, 0.0]])
    roll = _t([[-1.5, -1.0, NAN]])
    mask = torch.tensor([[1, 1, 0]])
    m = mismatch_metrics(old, roll, mask)
    # roll - old = [-0.5, 1.0]; d = old - roll = [0.5, -1.0]
    assert_close(m["mismatch_mean_diff"], torch.tensor((-0.5 + 1.0) / 2), atol=1e-6, rtol=0)
    k3 = ((math.exp(0.5) - 0.5 - 1.0) + (math.exp(-1.0) + 1.0 - 1.0)) / 2
    assert_close(m["mismatch_k3"], torch.tensor(k3), atol=1e-6, rtol=0)
    assert_close(m["mismatch_max_abs"], torch.tensor(1.0), atol=1e-6, rtol=0)
    empty = mismatch_metrics(old, roll, torch.zeros(1, 3))
    assert all(v.item() == 0.0 for v in empty.values())
    huge = mismatch_metrics(_t([[0.0, -100.0]]), _t([[-100.0, 0.0]]), torch.ones(1, 2))
    assert all(torch.isfinite(v) for v in huge.values())


def test_mismatch_k3_estimates_kl_roll_to_old():
    """Tokens come from pi_roll: sum_o pi_roll(o) * k3(o) is exactly KL(pi_roll || pi_old)."""
    roll = torch.log_softmax(torch.tensor([0.2, -0.4, 1.0, 0.0]), -1)
    old = torch.log_softmax(torch.tensor([0.5, -0.1, 0.6, 0.2]), -1)
    mask = torch.ones(1, 4)
    d = old - roll
    k3 = torch.exp(d) - d - 1.0
    # E_roll[k3] = KL(pi_roll || pi_old), while E_roll[k3 with d = roll - old] would not be KL(old || roll)
    assert_close((roll.exp() * k3).sum(), (roll.exp() * (roll - old)).sum(), atol=1e-6, rtol=0)
    flipped = torch.exp(-d) + d - 1.0
    assert ((roll.exp() * flipped).sum() - (old.exp() * (old - roll)).sum()).abs() > 1e-3
    # the function averages exactly this k3 over valid tokens
    assert_close(mismatch_metrics(old[None], roll[None], mask)["mismatch_k3"], k3.mean(), atol=1e-6, rtol=0)
