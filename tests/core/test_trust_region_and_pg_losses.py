"""The soft-gated, trust-region, geometric-mean and plain policy-gradient losses: hand-worked numbers, plain-loop references of verl's formulas
(same inputs -> same value and gradient), gradient checks and bad input."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_grpo.core import GRPOLoss
from lightning_grpo.core.pg_losses import dro_loss, gpg_loss, reinforce_loss
from lightning_grpo.core.policy_losses import cispo_loss, geo_mean_loss
from lightning_grpo.core.registry import POLICY_LOSSES
from lightning_grpo.core.trust_region_losses import dppo_kl_loss, dppo_tv_loss, sapo_loss

NEW = ["sapo", "dppo_tv", "dppo_kl", "dro", "geo_mean", "gpg", "reinforce"]
ARGS = {"dro": {"beta": 0.5}}


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


def one(logp, old, adv, fn, **kw):
    """A single-token batch: (loss value, d loss / d logp)."""
    lp = torch.tensor([[logp]], dtype=torch.float64, requires_grad=True)
    out = fn(
        lp, torch.tensor([[old]], dtype=torch.float64), torch.tensor([adv], dtype=torch.float64), torch.ones(1, 1), **kw
    )
    out.loss.sum().backward()
    return out.loss.item(), lp.grad.item(), out.metrics


def random_batch(seed, B=6, T=7, per_token_adv=False):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2.0 - 0.1  # [B, T] in [-2.1, -0.1]
    logp = (old + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    adv = 0.5 * torch.randn(*((B, T) if per_token_adv else (B,)), generator=g, dtype=torch.float64)
    mask = (torch.rand(B, T, generator=g) > 0.25).double()
    mask[0] = 1.0
    mask[-1] = 0.0  # one empty completion
    return logp, old, adv, mask


# ------------------------------------------------------------------------------- hand-worked
def test_sapo_by_hand():
    def sig(z):
        return 1.0 / (1.0 + math.exp(-z))

    value, grad, metrics = one(math.log(0.6), math.log(0.5), 1.0, sapo_loss)  # r = 1.2, tau_pos = 1
    assert value == pytest.approx(-4.0 * sig(0.2), abs=1e-12)  # -2.199336
    assert value == pytest.approx(-2.199336, abs=1e-6)
    assert grad == pytest.approx(-4.0 * sig(0.2) * (1 - sig(0.2)) * 1.2, abs=1e-12)  # -1.188080
    assert metrics["gate_weight_mean"].item() == pytest.approx(4 * sig(0.2) * (1 - sig(0.2)), abs=1e-6)
    value, grad, _ = one(math.log(0.4), math.log(0.5), -1.0, sapo_loss)  # r = 0.8, tau_neg = 1.05
    assert value == pytest.approx((4 / 1.05) * sig(-0.21), abs=1e-12)  # 1.705493
    assert grad == pytest.approx(4.0 * sig(-0.21) * (1 - sig(-0.21)) * 0.8, abs=1e-12)


@pytest.mark.parametrize("adv", [1.7, -0.6])
def test_sapo_gradient_at_ratio_one_equals_ppo(adv):
    from lightning_grpo.core.policy_losses import ppo_loss

    _, g_sapo, _ = one(-1.3, -1.3, adv, sapo_loss)
    _, g_ppo, _ = one(-1.3, -1.3, adv, ppo_loss)
    assert g_sapo == pytest.approx(g_ppo, abs=1e-12) and g_ppo == pytest.approx(-adv, abs=1e-12)


def test_dppo_tv_by_hand():
    lo5 = math.log(0.5)
    value, grad, m = one(math.log(0.6), lo5, 1.0, dppo_tv_loss)  # p - p_old = 0.1 <= 0.15: trains
    assert value == pytest.approx(-1.2 * math.log(0.6), abs=1e-12) and grad == pytest.approx(-1.2, abs=1e-12)
    assert m["clip_frac_high"].item() == 0.0
    value, grad, m = one(math.log(0.7), lo5, 1.0, dppo_tv_loss)  # 0.2 > 0.15: outside, no gradient
    assert value == 0.0 and grad == 0.0 and m["clip_frac_high"].item() == 1.0
    value, grad, m = one(math.log(0.4), lo5, -1.0, dppo_tv_loss)  # -0.1 >= -0.15
    assert value == pytest.approx(0.8 * math.log(0.4), abs=1e-12) and grad == pytest.approx(0.8, abs=1e-12)
    value, grad, m = one(math.log(0.3), lo5, -1.0, dppo_tv_loss)  # -0.2 < -0.15
    assert value == 0.0 and grad == 0.0 and m["clip_frac_low"].item() == 1.0
    value, grad, m = one(math.log(0.9), math.log(0.01), -1.0, dppo_tv_loss, delta_low=1.0, clip_ratio_c=20.0)
    assert grad == pytest.approx(20.0, abs=1e-12) and m["clip_frac_dual"].item() == 1.0  # r = 90 capped at c


def test_dppo_kl_by_hand():
    # p_old = 0.5, p = 0.6: D = 0.5 log(0.5/0.6) + 0.5 log(0.5/0.4) = 0.020411 <= 0.05: trains
    d = 0.5 * math.log(0.5 / 0.6) + 0.5 * math.log(0.5 / 0.4)
    assert d == pytest.approx(0.020411, abs=1e-6)
    _, grad, _ = one(math.log(0.6), math.log(0.5), 1.0, dppo_kl_loss)
    assert grad == pytest.approx(-1.2, abs=1e-12)
    # p = 0.7: D = 0.087177 > 0.05 and p rose on A > 0: outside
    _, grad, m = one(math.log(0.7), math.log(0.5), 1.0, dppo_kl_loss)
    assert grad == 0.0 and m["clip_frac_high"].item() == 1.0
    # p = 0.1 fell on A > 0 (the safe way): inside however large D
    _, grad, _ = one(math.log(0.1), math.log(0.5), 1.0, dppo_kl_loss)
    assert grad == pytest.approx(-0.2, abs=1e-12)
    _, grad, _ = one(math.log(0.7), math.log(0.5), -1.0, dppo_kl_loss)  # rose on A < 0: the safe way
    assert grad == pytest.approx(1.4, abs=1e-12)


def test_dro_by_hand():
    value, grad, _ = one(-1.0, -1.4, 2.0, dro_loss, beta=0.5)
    assert value == pytest.approx(2.04, abs=1e-12)  # -(-1 * 2 - 0.25 * 0.4^2)
    assert grad == pytest.approx(-1.8, abs=1e-12)  # -(A - beta (logp - old))


def test_geo_mean_by_hand():
    old = torch.zeros(2, 3, dtype=torch.float64) - 1.0
    d = torch.tensor([[0.5, -0.1, 0.2], [-0.6, 0.3, 0.0]], dtype=torch.float64)
    logp = (old + d).requires_grad_()
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    out = geo_mean_loss(logp, old, adv, mask)
    s0, s1 = math.exp(0.5 / 3), math.exp(-0.05)  # clipped log-ratios [0.4, -0.1, 0.2] and [-0.4, 0.3]
    close(out.loss, [[-s0] * 3, [s1, s1, 0.0]], atol=1e-12)
    loss = GRPOLoss(policy_loss="geo_mean")(logp, mask, adv, old_logp=old).loss
    assert loss.item() == pytest.approx((-s0 + s1) / 2, abs=1e-12)
    loss.backward()  # the clipped tokens (0.5 for A > 0, -0.6 for A < 0) get no gradient
    close(logp.grad, [[0.0, -s0 / 3 / 2, -s0 / 3 / 2], [0.0, s1 / 2 / 2, 0.0]], atol=1e-12)
    assert out.metrics["clip_frac_high"].item() == pytest.approx(1 / 5) and out.metrics[
        "clip_frac_low"
    ].item() == pytest.approx(1 / 5)


def test_gpg_and_reinforce_by_hand():
    value, grad, _ = one(-0.7, -2.0, 1.5, gpg_loss)
    assert value == pytest.approx(1.05, abs=1e-12) and grad == pytest.approx(-1.5, abs=1e-12)
    value, grad, _ = one(math.log(0.3), math.log(0.1), 1.0, reinforce_loss)  # r = 3 truncated at cap 2
    assert value == pytest.approx(-2.0 * math.log(0.3), abs=1e-12) and grad == pytest.approx(-2.0, abs=1e-12)
    _, grad, _ = one(math.log(0.15), math.log(0.1), 1.0, reinforce_loss)  # r = 1.5 kept
    assert grad == pytest.approx(-1.5, abs=1e-12)


def test_reinforce_equals_cispo_with_the_cap():
    logp, old, adv, mask = random_batch(3)
    a = reinforce_loss(logp, old, adv, mask, cap=1.5)
    b = cispo_loss(logp, old, adv, mask, eps_high=0.5, eps_low=None)
    close(a.loss, b.loss, atol=0.0)


# ------------------------------------------------------------------- loop references (verl)
def _loop(fn_token, logp, old, adv, mask):
    """Per-token loss [B, T] of a plain-Python formula fn_token(lp, o, a) -> value."""
    B, T = logp.shape
    a = adv if adv.dim() == 2 else adv[:, None].expand(B, T)
    rows = [
        [fn_token(float(logp[b, t]), float(old[b, t]), float(a[b, t])) if mask[b, t] else 0.0 for t in range(T)]
        for b in range(B)
    ]
    return torch.tensor(rows, dtype=torch.float64)


def _ratio(lp, o):
    return math.exp(max(-20.0, min(20.0, lp - o)))


def verl_sapo(lp, o, a, tau_pos=1.0, tau_neg=1.05):
    tau = tau_pos if a > 0 else tau_neg
    return -(4.0 / tau) / (1.0 + math.exp(-tau * (_ratio(lp, o) - 1.0))) * a


def verl_dppo_tv(lp, o, a, low=0.15, high=0.15, c=20.0):
    diff = math.exp(lp) - math.exp(o)
    valid = diff <= high if a > 0 else diff >= -low
    return -a * min(_ratio(lp, o), c) * lp * valid


def verl_dppo_kl(lp, o, a, low=0.05, high=0.05, c=20.0):
    p, po = math.exp(lp), math.exp(o)
    kl = po * (o - lp) + (1 - po) * math.log((1 - po + 1e-8) / (1 - p + 1e-8))
    valid = (kl <= high or p <= po) if a > 0 else (kl <= low or p >= po)
    return -a * min(_ratio(lp, o), c) * lp * valid


def verl_dro(lp, o, a, beta=0.5):
    return -(lp * a - 0.5 * beta * (lp - o) ** 2)


def verl_gpg(lp, o, a):
    return -a * lp


LOOPS = {"sapo": verl_sapo, "dppo_tv": verl_dppo_tv, "dppo_kl": verl_dppo_kl, "dro": verl_dro, "gpg": verl_gpg}


@pytest.mark.parametrize("name", sorted(LOOPS))
@pytest.mark.parametrize("per_token_adv", [False, True])
def test_token_losses_match_the_loop_reference(name, per_token_adv):
    for seed in range(4):
        logp, old, adv, mask = random_batch(seed, per_token_adv=per_token_adv)
        out = POLICY_LOSSES.get(name)(logp, old, adv, mask, **ARGS.get(name, {}))
        close(out.loss, _loop(LOOPS[name], logp, old, adv, mask), atol=1e-12)


def verl_geo_mean_rows(logp, old, adv, mask, eps_low=0.4, eps_high=0.4):
    """GMPO per row, a loop over tokens: [B] loss -A_i s_i."""
    out = []
    for b in range(logp.shape[0]):
        toks = [t for t in range(logp.shape[1]) if mask[b, t]]
        a_row = adv[b] if adv.dim() == 1 else None
        total = 0.0
        for t in toks:
            a = float(a_row if a_row is not None else adv[b, t])
            d = float(logp[b, t] - old[b, t])
            c = min(max(d, -eps_low), eps_high)
            sgn = (a > 0) - (a < 0)
            total += sgn * min(sgn * d, sgn * c)
        n = max(len(toks), 1)
        a_mean = float(adv[b]) if adv.dim() == 1 else sum(float(adv[b, t]) for t in toks) / n
        out.append(0.0 if not toks else -a_mean * math.exp(total / n))
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("per_token_adv", [False, True])
def test_geo_mean_matches_the_loop_reference_value_and_gradient(per_token_adv):
    logp, old, adv, mask = random_batch(5, per_token_adv=per_token_adv)
    lp = logp.clone().requires_grad_()
    loss = GRPOLoss(policy_loss="geo_mean")(lp, mask, adv, old_logp=old).loss
    ref_lp = logp.clone().requires_grad_()
    # the reference in differentiable torch ops, token by token (verl's formula, mean over all B rows)
    rows = []
    for b in range(logp.shape[0]):
        m = mask[b].bool()
        if not m.any():
            rows.append(ref_lp.new_zeros(()))
            continue
        d = ref_lp[b][m] - old[b][m]
        a = adv[b] if adv.dim() == 1 else adv[b][m]
        sgn = torch.sign(a) * torch.ones_like(d)
        lt = sgn * torch.minimum(sgn * d, sgn * d.clamp(-0.4, 0.4))
        rows.append(-(a.mean() if adv.dim() == 2 else a) * torch.exp(lt.mean()))
    ref = torch.stack(rows).mean()
    close(loss.detach(), ref.detach(), atol=1e-12)
    close(loss.detach(), verl_geo_mean_rows(logp, old, adv, mask).mean(), atol=1e-12)
    loss.backward()
    ref.backward()
    close(lp.grad, ref_lp.grad, atol=1e-12)


def test_sapo_default_aggregation_is_verls_seq_mean_token_mean():
    logp, old, adv, mask = random_batch(6)
    loss = GRPOLoss(policy_loss="sapo")(logp, mask, adv, old_logp=old).loss
    per_token = _loop(verl_sapo, logp, old, adv, mask)
    rows = per_token.sum(-1) / mask.sum(-1).clamp(min=1)
    assert loss.item() == pytest.approx(rows.mean().item(), abs=1e-12)
    assert GRPOLoss(policy_loss="sapo", aggregation="token_mean").aggregation == "token_mean"


# ------------------------------------------------------------------------- gradient checks
#: Losses whose weight is a stop-gradient (sg[min(r, c)]): their gradient is not the value's derivative.
STOP_GRADIENT = {"dppo_tv": verl_dppo_tv, "dppo_kl": verl_dppo_kl}


@pytest.mark.parametrize("name", sorted(set(NEW) - set(STOP_GRADIENT) - {"reinforce"}))
def test_gradcheck(name):
    logp, old, adv, mask = random_batch(11, B=3, T=4)
    loss = GRPOLoss(policy_loss=name, policy_loss_args=ARGS.get(name))

    def f(lp):
        return loss(lp, mask, adv, old_logp=old).loss

    assert torch.autograd.gradcheck(f, (logp.clone().requires_grad_(),), eps=1e-7, atol=1e-6)


@pytest.mark.parametrize("name", sorted(STOP_GRADIENT))
def test_stop_gradient_losses_gradient_is_the_weighted_score(name):
    """d L / d logp_t = -A_t sg[min(r_t, c)] valid_t / N_tokens under token_mean: the loop formula's
    value divided by logp_t (L_t is linear in logp_t with a frozen weight)."""
    logp, old, adv, mask = random_batch(11)
    lp = logp.clone().requires_grad_()
    GRPOLoss(policy_loss=name)(lp, mask, adv, old_logp=old).loss.backward()
    expected = _loop(lambda p, o, a: STOP_GRADIENT[name](p, o, a) / p, logp, old, adv, mask) / mask.sum()
    close(lp.grad, expected, atol=1e-12)


# ----------------------------------------------------------------------------- bad input
def test_bad_parameters_fail_with_one_clear_error():
    logp, old, adv, mask = random_batch(0)
    with pytest.raises(ValueError, match=r"policy loss 'dro' needs policy_loss_args \['beta'\]"):
        GRPOLoss(policy_loss="dro")
    with pytest.raises(ValueError, match=r"dro needs beta > 0"):
        dro_loss(logp, old, adv, mask, beta=0.0)
    with pytest.raises(ValueError, match=r"tau_pos and tau_neg must be > 0"):
        sapo_loss(logp, old, adv, mask, tau_neg=0.0)
    with pytest.raises(ValueError, match=r"delta_low and delta_high must be >= 0"):
        dppo_tv_loss(logp, old, adv, mask, delta_high=-0.1)
    with pytest.raises(ValueError, match=r"reinforce cap must be >= 1"):
        reinforce_loss(logp, old, adv, mask, cap=0.5)
    with pytest.raises(
        ValueError,
        match=r"policy_loss 'geo_mean' aggregates per sequence itself and needs aggregation 'seq_mean_token_mean'",
    ):
        GRPOLoss(policy_loss="geo_mean", aggregation="token_mean")
    with pytest.raises(ValueError, match=r"policy_loss_args \['tau'\] are not parameters of policy loss 'sapo'"):
        GRPOLoss(policy_loss="sapo", policy_loss_args={"tau": 1.0})


@pytest.mark.parametrize("name", NEW)
def test_masked_tokens_get_zero_loss_and_no_gradient(name):
    logp, old, adv, mask = random_batch(2)
    lp = logp.clone().requires_grad_()
    out = POLICY_LOSSES.get(name)(lp, old, adv, mask, **ARGS.get(name, {}))
    assert (out.loss[mask == 0] == 0).all()
    out.loss.sum().backward()
    assert (lp.grad[mask == 0] == 0).all()
    for key, v in out.metrics.items():
        assert v.dim() == 0 and not v.requires_grad, key
