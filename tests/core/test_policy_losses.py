"""Policy losses: hand-worked numbers, plain-loop references, gradients and edge cases."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_grpo.core.policy_losses import (
    PolicyLossOutput,
    cispo_loss,
    clip_cov_loss,
    clipped_surrogate,
    delta_clip_loss,
    dual_clip_loss,
    gspo_loss,
    gspo_token_loss,
    kl_cov_loss,
    ppo_loss,
)
from lightning_grpo.core.registry import POLICY_LOSSES

ALL = ["ppo", "dual_clip", "delta_clip", "gspo", "gspo_token", "cispo", "clip_cov", "kl_cov"]


def close(actual, expected, atol=1e-6):
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=0)


def seq_mean_token_mean(loss, mask):
    m = mask.float()
    return ((loss * m).sum(-1) / m.sum(-1).clamp(min=1)).mean()


def random_batch(seed, B=6, T=7, per_token_adv=False):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) * 2.0 - 0.1  # [B, T] in [-2.1, -0.1]
    logp = old + 0.3 * torch.randn(B, T, generator=g)
    shape = (B, T) if per_token_adv else (B,)
    adv = 0.5 * torch.randn(*shape, generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.25).float()
    mask[-1] = 0.0  # one empty completion
    mask[0] = 1.0
    return logp, old, adv, mask


def test_registry_holds_every_loss():
    assert set(ALL) <= set(POLICY_LOSSES.names())
    logp, old, adv, mask = random_batch(0)
    for name in ALL:
        out = POLICY_LOSSES.get(name)(logp, old, adv, mask, generator=torch.Generator().manual_seed(0))
        assert isinstance(out, PolicyLossOutput)
        assert out.loss.shape == logp.shape and out.loss.dtype == torch.float32
        assert (out.loss[mask == 0] == 0).all()
        for key, v in out.metrics.items():
            assert v.dim() == 0 and not v.requires_grad and v.dtype == torch.float32, key


# ---------------------------------------------------------------- hand-worked 2 x 3 case
# old = 0, logp = log(r): row 0 has A = +1 and ratios 0.5, 1.1, 1.5; row 1 has A = -2 and
# ratios 0.5, 1.1, 4.0. eps_low = 0.2, eps_high = 0.28 (Clip-Higher): clip band [0.8, 1.28].
RATIOS = [[0.5, 1.1, 1.5], [0.5, 1.1, 4.0]]
ADV = [1.0, -2.0]
ADV_C = [1.0, -2.0]  # the CISPO case


def hand_inputs():
    logp = torch.tensor(RATIOS).log().requires_grad_(True)
    return logp, torch.zeros(2, 3), torch.tensor(ADV), torch.ones(2, 3)


def test_ppo_clip_higher_hand_worked():
    logp, old, adv, mask = hand_inputs()
    out = ppo_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    expected = [
        [-min(0.5 * 1, 0.8 * 1), -min(1.1 * 1, 1.1 * 1), -min(1.5 * 1, 1.28 * 1)],
        [-min(0.5 * -2, 0.8 * -2), -min(1.1 * -2, 1.1 * -2), -min(4.0 * -2, 1.28 * -2)],
    ]  # [[-0.5, -1.1, -1.28], [1.6, 2.2, 8.0]]
    close(out.loss, expected)
    close(out.metrics["clip_frac_low"], 1 / 6)  # (1, 0): A < 0 and r = 0.5 < 0.8
    close(out.metrics["clip_frac_high"], 1 / 6)  # (0, 2): A > 0 and r = 1.5 > 1.28
    close(out.metrics["ratio_min"], 0.5)
    close(out.metrics["ratio_max"], 4.0)
    close(out.metrics["ratio_mean"], (0.5 + 1.1 + 1.5 + 0.5 + 1.1 + 4.0) / 6)
    out.loss.sum().backward()
    # d L / d logp = -A r where the unclipped term is active, 0 where the clip is active
    close(logp.grad, [[-0.5, -1.1, 0.0], [0.0, 2 * 1.1, 2 * 4.0]])


def test_dual_clip_hand_worked():
    logp, old, adv, mask = hand_inputs()
    out = dual_clip_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28, clip_ratio_c=3.0)
    # only (1, 2) changes: A = -2, r = 4 > c = 3 -> min(8.0, -(-2) * 3) = 6.0
    close(out.loss, [[-0.5, -1.1, -1.28], [1.6, 2.2, min(8.0, 2 * 3.0)]])
    close(out.metrics["clip_frac_dual"], 1 / 6)
    out.loss.sum().backward()
    close(logp.grad, [[-0.5, -1.1, 0.0], [0.0, 2 * 1.1, 0.0]])


def test_delta_clip_hand_worked():
    logp, old, adv, mask = hand_inputs()
    out = delta_clip_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28, delta=3.0)
    # (1, 2): -min(min(4, 3) * -2, 1.28 * -2) = 6.0; other tokens as PPO (r < delta)
    close(out.loss, [[-0.5, -1.1, -1.28], [1.6, 2.2, -min(3.0 * -2, 1.28 * -2)]])
    close(out.metrics["clip_frac_dual"], 1 / 6)


def test_dual_clip_caps_negative_advantage_loss():
    g = torch.Generator().manual_seed(1)
    logp = (torch.randn(8, 16, generator=g) * 2).requires_grad_(True)
    old = torch.zeros(8, 16)
    adv = -torch.rand(8, generator=g) - 0.1  # all negative
    c = 3.0
    out = dual_clip_loss(logp, old, adv, torch.ones(8, 16), clip_ratio_c=c)
    cap = (-adv * c).unsqueeze(-1).expand(8, 16)
    assert (out.loss <= cap + 1e-6).all()
    over = logp.detach().exp() > c
    assert over.any()
    close(out.loss[over], cap[over])
    out.loss.sum().backward()
    assert (logp.grad[over] == 0).all()


def test_delta_clip_equals_dual_clip_when_delta_is_c():
    logp, old, adv, mask = random_batch(2)
    noise = torch.randn(old.shape, generator=torch.Generator().manual_seed(3))
    logp = (old + 1.5 * noise).requires_grad_(True)
    a = dual_clip_loss(logp, old, adv, mask, clip_ratio_c=3.0)
    b = delta_clip_loss(logp, old, adv, mask, delta=3.0)
    close(a.loss, b.loss)
    (ga,) = torch.autograd.grad(a.loss.sum(), logp)
    (gb,) = torch.autograd.grad(b.loss.sum(), logp)
    close(ga, gb)


def test_gspo_hand_worked():
    # row 0: log-ratios 0.1, -0.3, 0.5 -> mean 0.1; row 1: 0.2, 0.4, (masked 99) -> mean 0.3
    log_ratio = torch.tensor([[0.1, -0.3, 0.5], [0.2, 0.4, 99.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    s0, s1 = math.exp(0.1), math.exp(0.3)  # 1.10517, 1.34986
    expected = [
        [-min(s0 * 1, 1.2 * 1)] * 3,  # unclipped: -1.10517
        [-min(s1 * -1, 1.2 * -1)] * 2 + [0.0],  # A < 0, s > 1 + eps: unclipped, 1.34986
    ]
    for fn in (gspo_loss, gspo_token_loss):
        logp = log_ratio.clone().requires_grad_(True)
        out = fn(logp, torch.zeros(2, 3), adv, mask, eps_low=0.2, eps_high=0.2)
        close(out.loss, expected)
        close(out.metrics["ratio_mean"], (3 * s0 + 2 * s1) / 5)
        close(out.metrics["clip_frac_high"], 0.0)
        seq_mean_token_mean(out.loss, mask).backward()
        # d/dlogp_t of mean_i(L_i) = -(1/B) A_i s_i / |o_i|
        close(logp.grad, [[-s0 / 3 / 2] * 3, [s1 / 2 / 2] * 2 + [0.0]])
    # paper defaults (3e-4 / 4e-4): row 0 is clipped at 1.0004
    out = gspo_loss(log_ratio, torch.zeros(2, 3), adv, mask)
    close(out.loss[0], [-1.0004] * 3)


def test_gspo_and_gspo_token_same_value_and_gradient_with_shared_advantage():
    logp0, old, adv, mask = random_batch(4)
    kwargs = dict(eps_low=0.2, eps_high=0.2)
    la = logp0.clone().requires_grad_(True)
    lb = logp0.clone().requires_grad_(True)
    a = gspo_loss(la, old, adv, mask, **kwargs)
    b = gspo_token_loss(lb, old, adv, mask, **kwargs)
    close(a.loss, b.loss)
    seq_mean_token_mean(a.loss, mask).backward()
    seq_mean_token_mean(b.loss, mask).backward()
    assert la.grad.abs().sum() > 0
    close(la.grad, lb.grad)
    # [B, T] advantages equal along each row give the same gradients as [B]
    lc = logp0.clone().requires_grad_(True)
    c = gspo_token_loss(lc, old, adv.unsqueeze(-1).expand_as(old).clone(), mask, **kwargs)
    seq_mean_token_mean(c.loss, mask).backward()
    close(lc.grad, lb.grad)


def test_gspo_and_gspo_token_differ_with_per_token_advantages():
    logp0, old, adv, mask = random_batch(5, per_token_adv=True)
    kwargs = dict(eps_low=0.2, eps_high=0.2)
    la = logp0.clone().requires_grad_(True)
    lb = logp0.clone().requires_grad_(True)
    a = gspo_loss(la, old, adv, mask, **kwargs)
    b = gspo_token_loss(lb, old, adv, mask, **kwargs)
    close(a.loss, b.loss)  # same values
    seq_mean_token_mean(a.loss, mask).backward()
    seq_mean_token_mean(b.loss, mask).backward()
    assert (la.grad - lb.grad).abs().max() > 1e-3  # different gradients


def test_cispo_hand_worked_and_stop_gradient_weight():
    # ratios 0.5, 1.0, 6.0 (logp = old + log r), A = +1 and -2
    old = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.5, -2.5]])
    r = torch.tensor([[0.5, 1.0, 6.0], [0.5, 1.0, 6.0]])
    logp = (old + r.log()).requires_grad_(True)
    adv = torch.tensor([1.0, -2.0])
    out = cispo_loss(logp, old, adv, torch.ones(2, 3))  # eps_high = 4: cap 5, no low clip
    w = [[0.5, 1.0, 5.0], [0.5, 1.0, 5.0]]
    lp = (old + r.log()).tolist()
    close(out.loss, [[-w[i][t] * ADV_C[i] * lp[i][t] for t in range(3)] for i in range(2)])
    close(out.metrics["clip_frac_high"], 1 / 6)  # (0, 2): A > 0 and r = 6 > 5
    out.loss.sum().backward()
    # gradient is -sg[w] * A * dlogp: no term from d w / d logp
    close(logp.grad, [[-w[i][t] * ADV_C[i] for t in range(3)] for i in range(2)])
    # with a low clip (eps_low = 0.2) the 0.5 weights become 0.8
    out = cispo_loss(logp.detach(), old, adv, torch.ones(2, 3), eps_low=0.2)
    close(out.loss[0, 0], -0.8 * 1.0 * lp[0][0])


def clip_cov_inputs():
    # A - mean A = +-2 and logp - mean logp = +-1 -> cov row 0: 2, 0, -2; row 1: 2, 0, -2.
    # (0, 0) is already clipped by PPO (A > 0, r = e^0.5 > 1.2), so only (1, 0) is a candidate.
    logp = torch.tensor([[1.0, 0.0, -1.0], [-1.0, 0.0, 1.0]]).requires_grad_(True)
    old = logp.detach() - torch.tensor([[0.5, 0.0, 0.0], [0.0, 0.0, 0.0]])
    return logp, old, torch.tensor([2.0, -2.0]), torch.ones(2, 3)


def test_clip_cov_hand_worked():
    logp, old, adv, mask = clip_cov_inputs()
    out = clip_cov_loss(logp, old, adv, mask, generator=torch.Generator().manual_seed(0))
    e = math.exp(0.5)
    close(out.loss, [[-min(e * 2, 1.2 * 2), -2.0, -2.0], [0.0, 2.0, 2.0]])
    close(out.metrics["clip_cov_frac"], 1 / 6)
    out.loss.sum().backward()
    # (0, 0): PPO clip; (1, 0): chosen by Clip-Cov -> exactly zero gradient; others -A r = -A
    close(logp.grad, [[0.0, -2.0, -2.0], [0.0, 2.0, 2.0]])
    assert logp.grad[1, 0].item() == 0.0


def cov_candidates_loop(logp, old, adv, mask, eps_low, eps_high, lb, ub):
    B, T = logp.shape
    valid = [(i, t) for i in range(B) for t in range(T) if mask[i, t] != 0]
    a_bar = sum(float(adv[i, t]) for i, t in valid) / len(valid)
    l_bar = sum(float(logp[i, t]) for i, t in valid) / len(valid)
    out = set()
    for i, t in valid:
        r = math.exp(float(logp[i, t] - old[i, t]))
        a = float(adv[i, t])
        clipped = -a * min(max(r, 1 - eps_low), 1 + eps_high) > -a * r
        cov = (a - a_bar) * (float(logp[i, t]) - l_bar)
        if not clipped and lb < cov < ub:
            out.add((i, t))
    return out, len(valid)


def test_clip_cov_random_choice_is_reproducible_and_zero_gradient():
    g = torch.Generator().manual_seed(7)
    B, T = 8, 50
    logp0 = torch.randn(B, T, generator=g) * 2
    old = logp0 + 0.05 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, T, generator=g) * 2
    mask = (torch.rand(B, T, generator=g) > 0.2).float()
    kw = dict(clip_ratio=0.02, clip_cov_lb=1.0, clip_cov_ub=5.0)
    cand, n_valid = cov_candidates_loop(logp0, old, adv, mask, 0.2, 0.2, 1.0, 5.0)
    n = max(1, int(0.02 * n_valid))
    assert len(cand) > n  # a real random choice
    choices = []
    for seed in (0, 0, 1):
        logp = logp0.clone().requires_grad_(True)
        out = clip_cov_loss(logp, old, adv, mask, generator=torch.Generator().manual_seed(seed), **kw)
        ppo = ppo_loss(logp0, old, adv, mask)
        chosen = {tuple(ix) for ix in ((out.loss == 0) & (ppo.loss != 0)).nonzero().tolist()}
        assert len(chosen) == n and chosen <= cand
        out.loss.sum().backward()
        for i, t in chosen:
            assert logp.grad[i, t].item() == 0.0
        keep = torch.ones(B, T, dtype=torch.bool)
        for i, t in chosen:
            keep[i, t] = False
        close(out.loss[keep], ppo.loss[keep])
        choices.append(chosen)
    assert choices[0] == choices[1]  # same seed, same tokens
    assert choices[0] != choices[2]  # another seed, another draw


def test_kl_cov_hand_worked():
    # cov row 0: 2, 0, -2; row 1 (logp -2, 0, 2): 4, 0, -4 -> top-1 is (1, 0), top-2 adds (0, 0)
    logp = torch.tensor([[1.0, 0.0, -1.0], [-2.0, 0.0, 2.0]]).requires_grad_(True)
    old = logp.detach() + torch.tensor([[0.0, 0.0, 0.0], [0.3, 0.0, 0.0]])
    adv, mask = torch.tensor([2.0, -2.0]), torch.ones(2, 3)
    r10 = math.exp(-0.3)
    out = kl_cov_loss(logp, old, adv, mask)  # k = max(1, int(6 * 2e-4)) = 1, coef 0.1
    close(out.loss, [[-2.0, -2.0, -2.0], [2.0 * r10 + 0.1 * 0.3, 2.0, 2.0]])
    close(out.metrics["kl_cov_frac"], 1 / 6)
    out.loss.sum().backward()
    # d/dlogp (-A r + 0.1 |logp - old|) at (1, 0) = 2 r - 0.1 (logp < old)
    close(logp.grad, [[-2.0, -2.0, -2.0], [2.0 * r10 - 0.1, 2.0, 2.0]])
    out = kl_cov_loss(logp.detach(), old, adv, mask, kl_cov_ratio=0.34, ppo_kl_coef=1.0)  # k = 2
    close(out.loss, [[-2.0 + 0.0, -2.0, -2.0], [2.0 * r10 + 0.3, 2.0, 2.0]])
    close(out.metrics["kl_cov_frac"], 2 / 6)


# ---------------------------------------------------------------- plain-loop references
def ref_surrogate(r, a, el, eh, cap=None):
    u = r if cap is None else min(r, cap)
    return -min(u * a, min(max(r, 1 - el), 1 + eh) * a)


def loop_reference(name, logp, old, adv, mask, **kw):
    """Per-token loss by Python loops over floats (clip_cov excluded: random)."""
    B, T = logp.shape
    A = adv.unsqueeze(-1).expand(B, T) if adv.dim() == 1 else adv
    out = [[0.0] * T for _ in range(B)]
    covs = {}
    valid = [(i, t) for i in range(B) for t in range(T) if mask[i, t] != 0]
    for i in range(B):
        toks = [t for t in range(T) if mask[i, t] != 0]
        lrs = {t: float(logp[i, t]) - float(old[i, t]) for t in toks}
        s = math.exp(max(-20.0, min(20.0, sum(lrs.values()) / max(len(toks), 1))))
        for t in toks:
            r, a = math.exp(max(-20.0, min(20.0, lrs[t]))), float(A[i, t])
            if name == "ppo":
                out[i][t] = ref_surrogate(r, a, kw["eps_low"], kw["eps_high"])
            elif name == "dual_clip":
                v = ref_surrogate(r, a, kw["eps_low"], kw["eps_high"])
                out[i][t] = min(v, -a * kw["clip_ratio_c"]) if a < 0 else v
            elif name == "delta_clip":
                out[i][t] = ref_surrogate(r, a, kw["eps_low"], kw["eps_high"], kw["delta"])
            elif name in ("gspo", "gspo_token"):
                out[i][t] = ref_surrogate(s, a, kw["eps_low"], kw["eps_high"])
            elif name == "cispo":
                out[i][t] = -min(r, 1 + kw["eps_high"]) * a * float(logp[i, t])
            elif name == "kl_cov":
                out[i][t] = -a * r
    if name == "kl_cov":
        a_bar = sum(float(A[i, t]) for i, t in valid) / len(valid)
        l_bar = sum(float(logp[i, t]) for i, t in valid) / len(valid)
        covs = {(i, t): (float(A[i, t]) - a_bar) * (float(logp[i, t]) - l_bar) for i, t in valid}
        k = max(1, int(kw["kl_cov_ratio"] * len(valid)))
        for i, t in sorted(covs, key=covs.get, reverse=True)[:k]:
            out[i][t] += kw["ppo_kl_coef"] * abs(float(logp[i, t]) - float(old[i, t]))
    return out


LOOP_CASES = [
    ("ppo", dict(eps_low=0.2, eps_high=0.28)),
    ("dual_clip", dict(eps_low=0.2, eps_high=0.2, clip_ratio_c=1.5)),
    ("delta_clip", dict(eps_low=0.1, eps_high=0.2, delta=1.4)),
    ("gspo", dict(eps_low=0.05, eps_high=0.1)),
    ("gspo_token", dict(eps_low=0.05, eps_high=0.1)),
    ("cispo", dict(eps_high=0.3)),
    ("kl_cov", dict(kl_cov_ratio=0.1, ppo_kl_coef=0.5)),
]


@pytest.mark.parametrize("per_token_adv", [False, True])
@pytest.mark.parametrize("name,kw", LOOP_CASES)
def test_vectorised_matches_loop(name, kw, per_token_adv):
    for seed in range(3):
        logp, old, adv, mask = random_batch(10 + seed, per_token_adv=per_token_adv)
        out = POLICY_LOSSES.get(name)(logp, old, adv, mask, **kw)
        close(out.loss, loop_reference(name, logp, old, adv, mask, **kw))


def test_clipped_surrogate_is_the_shared_formula():
    r = torch.tensor([0.5, 1.0, 1.5, 0.5, 1.5])
    a = torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0])
    expected = [ref_surrogate(x, y, 0.2, 0.2) for x, y in zip(r.tolist(), a.tolist())]
    close(clipped_surrogate(r, a, 0.2, 0.2), expected)


# ---------------------------------------------------------------- edge cases
@pytest.mark.parametrize("name", ALL)
def test_extreme_log_ratios_are_finite(name):
    old = torch.zeros(2, 4)
    logp = torch.tensor([[100.0, -100.0, 0.0, 50.0], [-100.0, 100.0, -50.0, 0.0]]).requires_grad_(True)
    for adv in (torch.tensor([1.0, -1.0]), torch.tensor([-1.0, 1.0])):
        gen = torch.Generator().manual_seed(0)
        out = POLICY_LOSSES.get(name)(logp, old, adv, torch.ones(2, 4), generator=gen)
        assert torch.isfinite(out.loss).all()
        (grad,) = torch.autograd.grad(out.loss.sum(), logp)
        assert torch.isfinite(grad).all()
        assert all(torch.isfinite(v) for v in out.metrics.values())


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("mask_dtype", [torch.float32, torch.bool])
def test_all_masked_gives_zero_loss_grads_and_metrics(name, mask_dtype):
    logp = torch.randn(3, 4).requires_grad_(True)
    old = torch.full((3, 4), float("nan"))  # garbage on masked positions must not leak
    out = POLICY_LOSSES.get(name)(logp, old, torch.randn(3), torch.zeros(3, 4, dtype=mask_dtype))
    assert (out.loss == 0).all()
    out.loss.sum().backward()
    assert (logp.grad == 0).all()
    for key, v in out.metrics.items():
        assert v.item() == 0.0, key


@pytest.mark.parametrize("name", ALL)
def test_nan_on_masked_positions_does_not_leak(name):
    logp, old, adv, mask = random_batch(20)
    logp = logp.masked_fill(mask == 0, float("nan")).requires_grad_(True)
    old = old.masked_fill(mask == 0, float("inf"))
    out = POLICY_LOSSES.get(name)(logp, old, adv, mask.bool(), generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(out.loss).all()
    (grad,) = torch.autograd.grad(out.loss.sum(), logp)
    assert torch.isfinite(grad).all() and (grad[mask == 0] == 0).all()


@pytest.mark.parametrize("name", ALL)
def test_bf16_inputs(name):
    logp, old, adv, mask = random_batch(30)
    lp16 = logp.bfloat16().requires_grad_(True)
    old16, adv16 = old.bfloat16(), adv.bfloat16()
    out = POLICY_LOSSES.get(name)(lp16, old16, adv16, mask, generator=torch.Generator().manual_seed(0))
    assert out.loss.dtype == torch.float32
    ref = POLICY_LOSSES.get(name)(
        lp16.float(), old16.float(), adv16.float(), mask, generator=torch.Generator().manual_seed(0)
    )
    close(out.loss, ref.loss)  # computed in float32 from the bf16 values
    out.loss.sum().backward()
    assert lp16.grad.dtype == torch.bfloat16 and torch.isfinite(lp16.grad.float()).all()


def test_bad_shapes_and_params_raise():
    logp, old, adv, mask = random_batch(0)
    with pytest.raises(ValueError):
        ppo_loss(logp, old, adv[:-1], mask)
    with pytest.raises(ValueError):
        ppo_loss(logp, old[:, :-1], adv, mask)
    with pytest.raises(ValueError):
        dual_clip_loss(logp, old, adv, mask, clip_ratio_c=1.0)
    with pytest.raises(ValueError):
        ppo_loss(logp, old, adv, mask, eps_low=-0.1)
