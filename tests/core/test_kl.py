"""KL estimators, KL-in-reward and KL controllers."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from lightning_grpo.core.kl import (
    AdaptiveKLController,
    FixedKLController,
    kl_k1,
    kl_k2,
    kl_k3,
    kl_k3_unbiased,
    kl_low_var,
    kl_penalty_in_reward,
)
from lightning_grpo.core.registry import KL_CONTROLLERS, KL_ESTIMATORS

NAN = float("nan")
E = math.e
ESTIMATORS = ["k1", "k2", "k3", "low_var_kl", "k3_unbiased", "k1+", "k3+", "low_var_kl+"]

# d = ref - logp = [-0.5, 1.0]
LOGP = torch.tensor([[-1.0, -2.0]])
REF = torch.tensor([[-1.5, -1.0]])


def test_registered_names():
    assert KL_ESTIMATORS.names() == sorted(ESTIMATORS)
    assert KL_CONTROLLERS.names() == ["adaptive", "fixed"]
    assert KL_ESTIMATORS.get("low_var_kl") is kl_low_var
    assert KL_CONTROLLERS.get("adaptive") is AdaptiveKLController


def test_hand_worked_values():
    assert_close(kl_k1(LOGP, REF), torch.tensor([[0.5, -1.0]]), atol=1e-6, rtol=0)
    assert_close(kl_k2(LOGP, REF), torch.tensor([[0.5 * 0.25, 0.5 * 1.0]]), atol=1e-6, rtol=0)
    k3 = [math.exp(-0.5) + 0.5 - 1.0, E - 1.0 - 1.0]
    assert_close(kl_k3(LOGP, REF), torch.tensor([k3]), atol=1e-6, rtol=0)
    assert_close(kl_low_var(LOGP, REF), torch.tensor([k3]), atol=1e-6, rtol=0)
    # k3_unbiased with old = [-1.2, -2.0]: rho = [exp(0.2), 1]
    old = torch.tensor([[-1.2, -2.0]])
    expected = [math.exp(0.2) * k3[0], 1.0 * k3[1]]
    assert_close(kl_k3_unbiased(LOGP, REF, old_logp=old), torch.tensor([expected]), atol=1e-6, rtol=0)


def test_clamps_at_plus_minus_100():
    logp = torch.tensor([[0.0, 0.0, -100.0, 0.0]])
    ref = torch.tensor([[-100.0, 100.0, 0.0, -15.0]])  # d = [-100, 100, 100, -15]
    k3 = kl_k3(logp, ref)
    # d clamped to +-20: exp(-20) + 20 - 1, exp(20) - 20 - 1, exp(20) - 20 - 1, exp(-15) + 15 - 1
    expected = [math.exp(-20.0) + 19.0, math.exp(20.0) - 21.0, math.exp(20.0) - 21.0, math.exp(-15.0) + 14.0]
    assert_close(k3, torch.tensor([expected]), atol=1e-6, rtol=1e-6)
    assert_close(kl_low_var(logp, ref), torch.tensor([[10.0, 10.0, 10.0, 10.0]]), atol=0, rtol=0)
    for name in ESTIMATORS:
        out = KL_ESTIMATORS.get(name)(logp, ref, old_logp=logp + 100.0)
        assert torch.isfinite(out).all(), name


@pytest.mark.parametrize("name", ESTIMATORS)
def test_nan_on_masked_positions_stays_out_of_value_and_grad(name):
    from lightning_grpo.core.logprobs import masked_sum

    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, NAN]])
    old = torch.tensor([[-1.2, -2.0, NAN]])
    mask = torch.tensor([[1, 1, 0]])
    total = masked_sum(KL_ESTIMATORS.get(name)(logp, ref, old_logp=old), mask)
    total.backward()
    assert torch.isfinite(total) and torch.isfinite(logp.grad).all()
    assert logp.grad[0, 2].item() == 0.0


def test_k2_clamps_d():
    out = kl_k2(torch.tensor([[0.0, 0.0]]), torch.tensor([[-100.0, 3.0]]))
    assert_close(out, torch.tensor([[0.5 * 20.0**2, 0.5 * 9.0]]), atol=1e-6, rtol=0)


def test_low_var_kl_passes_small_values_and_clamps_large():
    logp = torch.tensor([[0.0, 0.0]])
    ref = torch.tensor([[2.0, 3.0]])  # k3 = e^2 - 3 = 4.389 (kept), e^3 - 4 = 16.09 (clamped to 10)
    assert_close(kl_low_var(logp, ref), torch.tensor([[E**2 - 3.0, 10.0]]), atol=1e-6, rtol=0)


def test_k3_nonnegative_and_gradients_finite():
    g = torch.Generator().manual_seed(0)
    logp = (torch.randn(64, 32, generator=g) * 30).requires_grad_(True)
    ref = torch.randn(64, 32, generator=g) * 30
    for name in ESTIMATORS:
        out = KL_ESTIMATORS.get(name)(logp, ref, old_logp=logp.detach() + torch.randn(64, 32, generator=g))
        assert torch.isfinite(out).all(), name
        if name in ("k2", "k3", "low_var_kl", "k3_unbiased"):
            assert (out >= 0).all(), name
        (grad,) = torch.autograd.grad(out.sum(), logp)
        assert torch.isfinite(grad).all(), name


def _loop_reference(name, logp, ref, old):
    out = []
    for lp_row, r_row, o_row in zip(logp.tolist(), ref.tolist(), old.tolist()):
        row = []
        for lp, r, o in zip(lp_row, r_row, o_row):
            d = min(max(r - lp, -20.0), 20.0)
            k3 = math.exp(d) - d - 1.0
            row.append(
                {
                    "k1": lp - r,
                    "k2": 0.5 * d**2,
                    "k3": k3,
                    "low_var_kl": min(max(k3, -10.0), 10.0),
                    "k3_unbiased": math.exp(min(max(lp - o, -20.0), 20.0)) * k3,
                }[name]
            )
        out.append(row)
    return torch.tensor(out)


@pytest.mark.parametrize("name", ESTIMATORS)
def test_matches_loop_reference(name):
    g = torch.Generator().manual_seed(1)
    logp = -torch.rand(5, 9, generator=g) * 4
    ref = -torch.rand(5, 9, generator=g) * 4
    old = logp + 0.3 * torch.randn(5, 9, generator=g)
    out = KL_ESTIMATORS.get(name)(logp, ref, old_logp=old)
    assert_close(out, _loop_reference(name.rstrip("+"), logp, ref, old), atol=1e-5, rtol=1e-6)  # "+": the same value


@pytest.mark.parametrize("name", ESTIMATORS)
def test_bf16_inputs_give_float32(name):
    logp = LOGP.to(torch.bfloat16)
    ref = REF.to(torch.bfloat16)
    out = KL_ESTIMATORS.get(name)(logp, ref, old_logp=logp)
    assert out.dtype == torch.float32
    assert_close(out, KL_ESTIMATORS.get(name)(LOGP, REF, old_logp=LOGP), atol=1e-6, rtol=0)


def test_k3_unbiased_requires_old_and_gradient_by_hand():
    with pytest.raises(ValueError, match="old_logp"):
        kl_k3_unbiased(LOGP, REF)
    # L = exp(lp - o) * (exp(r - lp) - (r - lp) - 1); dL/dlp = rho * k3 + rho * (1 - exp(r - lp))
    lp = torch.tensor([[-1.0]], requires_grad=True)
    r, o = -1.5, -1.2
    kl_k3_unbiased(lp, torch.tensor([[r]]), old_logp=torch.tensor([[o]])).sum().backward()
    rho, d = math.exp(-1.0 - o), r - (-1.0)
    expected = rho * (math.exp(d) - d - 1.0) + rho * (1.0 - math.exp(d))
    assert_close(lp.grad, torch.tensor([[expected]]), atol=1e-6, rtol=0)
    # on-policy (old = sg[logp]): value equals k3, gradient gains the score term k3 * 1
    lp2 = torch.tensor([[-1.0]], requires_grad=True)
    val = kl_k3_unbiased(lp2, torch.tensor([[r]]), old_logp=lp2.detach())
    val.sum().backward()
    assert_close(val.detach(), kl_k3(torch.tensor([[-1.0]]), torch.tensor([[r]])), atol=1e-6, rtol=0)
    assert_close(lp2.grad, torch.tensor([[(math.exp(d) - d - 1.0) + (1.0 - math.exp(d))]]), atol=1e-6, rtol=0)


def test_k3_unbiased_expectation_and_gradient_are_exact_under_old_policy():
    """sum_o pi_old(o) * est(o) equals KL(pi_theta || pi_ref) in value and gradient (exact sums)."""
    logits = torch.tensor([0.3, -1.0, 0.8, 0.1], requires_grad=True)
    old = torch.log_softmax(torch.tensor([0.0, 0.5, -0.5, 1.0]), -1)
    ref = torch.log_softmax(torch.tensor([1.0, 0.0, 0.2, -0.3]), -1)

    logp = torch.log_softmax(logits, -1)
    exact = (logp.exp() * (logp - ref)).sum()
    (g_exact,) = torch.autograd.grad(exact, logits)

    logp = torch.log_softmax(logits, -1)
    est = (old.exp() * kl_k3_unbiased(logp[None], ref[None], old_logp=old[None])[0]).sum()
    (g_est,) = torch.autograd.grad(est, logits)
    assert_close(est, exact, atol=1e-6, rtol=0)
    assert_close(g_est, g_exact, atol=1e-6, rtol=0)

    # plain k3 on the same off-policy samples is biased
    logp = torch.log_softmax(logits, -1)
    biased = (old.exp() * kl_k3(logp[None], ref[None])[0]).sum()
    assert (biased - exact).abs() > 1e-3


def test_kl_penalty_in_reward():
    rewards = torch.tensor([1.0, 0.5])
    logp = torch.tensor([[-1.0, -2.0, NAN], [-0.5, -0.5, -0.5]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, 0.0], [-1.0, NAN, -0.2]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]])
    out = kl_penalty_in_reward(rewards, logp, ref, mask, beta=0.1)
    # k1 sums: row 0: 0.5 - 1.0 = -0.5; row 1: 0.5 + (-0.3) = 0.2
    assert_close(out, torch.tensor([1.0 - 0.1 * (-0.5), 0.5 - 0.1 * 0.2]), atol=1e-6, rtol=0)
    assert not out.requires_grad and out.dtype == torch.float32
    out3 = kl_penalty_in_reward(rewards, logp, ref, mask, beta=0.1, estimator="k2")
    assert_close(out3, torch.tensor([1.0 - 0.1 * (0.125 + 0.5), 0.5 - 0.1 * (0.125 + 0.045)]), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_penalty_in_reward(rewards, logp, ref, mask, beta=0.1, estimator="k7")


def test_fixed_controller():
    ctrl = KL_CONTROLLERS.get("fixed")(kl_coef=0.04)
    ctrl.update(5.0, 100)
    assert ctrl.value == 0.04
    assert FixedKLController().value == 0.001
    other = FixedKLController(0.5)
    other.load_state_dict(ctrl.state_dict())
    assert other.value == 0.04


def test_adaptive_controller_updates_by_hand():
    ctrl = KL_CONTROLLERS.get("adaptive")(kl_coef=0.2, target_kl=0.1, horizon=100)
    ctrl.update(0.15, 10)  # error = clip(0.15/0.1 - 1 = 0.5) = 0.2; value = 0.2 * (1 + 0.2 * 10/100)
    assert ctrl.value == pytest.approx(0.2 * 1.02, abs=1e-12)
    ctrl.update(torch.tensor(0.09), 50)  # error = 0.9 - 1 = -0.1; value *= 1 - 0.1 * 50/100
    assert ctrl.value == pytest.approx(0.2 * 1.02 * 0.95, abs=1e-7)
    ctrl.update(0.0, 100)  # error = clip(-1) = -0.2; value *= 1 - 0.2
    assert ctrl.value == pytest.approx(0.2 * 1.02 * 0.95 * 0.8, abs=1e-7)
    before = ctrl.value
    ctrl.update(float("nan"), 10)
    ctrl.update(float("inf"), 10)
    assert ctrl.value == before


def test_adaptive_controller_state_and_validation():
    ctrl = AdaptiveKLController()
    assert (ctrl.value, ctrl.target_kl, ctrl.horizon) == (0.001, 0.1, 10000)
    ctrl.update(1.0, 500)  # error 0.2 -> value = 0.001 * 1.01
    resumed = AdaptiveKLController()
    resumed.load_state_dict(ctrl.state_dict())
    assert resumed.value == pytest.approx(0.001 * 1.01, abs=1e-12)
    for bad in ({"kl_coef": -1.0}, {"target_kl": 0.0}, {"horizon": 0}):
        with pytest.raises(ValueError):
            AdaptiveKLController(**bad)


@pytest.mark.parametrize("name,value_fn", [("k1+", kl_k1), ("k3+", kl_k3), ("low_var_kl+", kl_low_var)])
def test_straight_through_has_the_value_of_its_estimator_and_the_gradient_of_k2(name, value_fn):
    """verl's "+" types: k2 - sg[k2] + sg[value]. d = ref - logp = [-0.5, 1.0]: k3 = [e^-0.5 - 0.5, e - 2],
    d k2 / d logp = logp - ref = [0.5, -1.0]."""
    logp = LOGP.clone().requires_grad_()
    out = KL_ESTIMATORS.get(name)(logp, REF)
    assert_close(out.detach(), value_fn(LOGP, REF), atol=0, rtol=0)
    out.sum().backward()
    assert_close(logp.grad, torch.tensor([[0.5, -1.0]]), atol=1e-7, rtol=0)
    if name == "k3+":
        assert_close(out.detach(), torch.tensor([[math.exp(-0.5) - 0.5, E - 2.0]]), atol=1e-6, rtol=0)


def test_straight_through_kl_in_the_loss_and_in_the_reward():
    from lightning_grpo.core import GRPOLoss, KLSettings

    logp = LOGP.clone().requires_grad_()
    mask = torch.ones(1, 2)
    out = GRPOLoss(kl=KLSettings(beta=0.5, estimator="k3+"))(logp, mask, torch.zeros(1), ref_logp=REF)
    out.loss.backward()  # token_mean of 0.5 * k2: gradient 0.5 * (logp - ref) / 2
    assert_close(logp.grad, torch.tensor([[0.125, -0.25]]), atol=1e-7, rtol=0)
    assert_close(out.metrics["kl"], kl_k3(LOGP, REF).mean(), atol=1e-7, rtol=0)
    shaped = kl_penalty_in_reward(torch.tensor([1.0]), LOGP, REF, mask, 0.5, estimator="k3+")
    assert_close(shaped, 1.0 - 0.5 * kl_k3(LOGP, REF).sum(-1), atol=1e-6, rtol=0)
