"""On-policy distillation's token advantage and GKD's generalised JSD: hand-worked values, a loop
reference of TRL's definition, gradient checks, bad input."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_grpo.core.distill import generalized_jsd, opd_advantages


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


def test_opd_advantages_by_hand():
    student = torch.tensor([[-0.5, -2.0, -1.0], [-0.1, -0.2, 0.0]])
    teacher = torch.tensor([[-0.1, -3.0, -9.0], [-2.1, -0.2, -5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    # k = student - teacher = [[-0.4, 1.0, x], [2.0, 0.0, 5.0]]; pure: A = -coef k
    close(opd_advantages(student, teacher, mask), [[0.4, -1.0, 0.0], [-2.0, 0.0, -5.0]])
    close(opd_advantages(student, teacher, mask, coef=0.5), [[0.2, -0.5, 0.0], [-1.0, 0.0, -2.5]])
    # mixed: the reward advantage [B] broadcast over tokens, then minus coef k
    close(
        opd_advantages(student, teacher, mask, reward_advantages=torch.tensor([1.0, -1.0])),
        [[1.4, 0.0, 0.0], [-3.0, -1.0, -6.0]],
    )


def test_opd_advantages_are_detached_and_check_shapes():
    student = torch.zeros(2, 3, requires_grad=True)
    out = opd_advantages(student, torch.zeros(2, 3), torch.ones(2, 3))
    assert not out.requires_grad and out.dtype == torch.float32
    with pytest.raises(ValueError, match=r"must share one \[B, T\] shape"):
        opd_advantages(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))


def _jsd_loop(s_logits, t_logits, beta, temperature=1.0):
    """TRL's generalised JSD for one position, from its definition, in plain Python."""

    def log_softmax(z):
        z = [v / temperature for v in z]
        m = max(z)
        lse = m + math.log(sum(math.exp(v - m) for v in z))
        return [v - lse for v in z]

    s, t = log_softmax(s_logits), log_softmax(t_logits)

    def kl(p, q):  # KL(p || q), logs in
        return sum(math.exp(a) * (a - b) for a, b in zip(p, q))

    if beta == 0:
        return kl(t, s)
    if beta == 1:
        return kl(s, t)
    m = [math.log(beta * math.exp(b) + (1 - beta) * math.exp(a)) for a, b in zip(s, t)]
    return beta * kl(t, m) + (1 - beta) * kl(s, m)


def test_generalized_jsd_by_hand():
    # two tokens: student p = (0.5, 0.5), teacher q = (0.8, 0.2)
    s = torch.log(torch.tensor([[0.5, 0.5]], dtype=torch.float64))
    t = torch.log(torch.tensor([[0.8, 0.2]], dtype=torch.float64))
    fwd = 0.8 * math.log(0.8 / 0.5) + 0.2 * math.log(0.2 / 0.5)  # KL(teacher || student) = 0.192745
    rev = 0.5 * math.log(0.5 / 0.8) + 0.5 * math.log(0.5 / 0.2)  # KL(student || teacher) = 0.223144
    assert generalized_jsd(s, t, beta=0.0).item() == pytest.approx(fwd, abs=1e-7)
    assert generalized_jsd(s, t, beta=1.0).item() == pytest.approx(rev, abs=1e-7)
    # the mixture m = 0.5 p + 0.5 q = (0.65, 0.35)
    jsd = 0.5 * (0.8 * math.log(0.8 / 0.65) + 0.2 * math.log(0.2 / 0.35)) + 0.5 * (
        0.5 * math.log(0.5 / 0.65) + 0.5 * math.log(0.5 / 0.35)
    )
    assert generalized_jsd(s, t, beta=0.5).item() == pytest.approx(jsd, abs=1e-7)  # 0.049041
    assert generalized_jsd(s, s, beta=0.5).item() == pytest.approx(0.0, abs=1e-7)


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_generalized_jsd_matches_the_loop(beta, temperature):
    g = torch.Generator().manual_seed(3)
    s = torch.randn(2, 3, 6, generator=g, dtype=torch.float64) * 2
    t = torch.randn(2, 3, 6, generator=g, dtype=torch.float64) * 2
    out = generalized_jsd(s, t, beta=beta, temperature=temperature)
    assert out.shape == (2, 3)
    expected = [[_jsd_loop(s[b, i].tolist(), t[b, i].tolist(), beta, temperature) for i in range(3)] for b in range(2)]
    close(out.double(), expected, atol=1e-6)
    assert (out >= -1e-7).all()


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_generalized_jsd_gradcheck(beta):
    g = torch.Generator().manual_seed(5)
    s = torch.randn(3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randn(3, 5, generator=g, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda x: generalized_jsd(x, t, beta=beta), (s,), eps=1e-7, atol=1e-7)
    s2 = s.detach().clone().requires_grad_()
    generalized_jsd(s2, t, beta=beta).sum().backward()
    assert t.grad is None and torch.isfinite(s2.grad).all()


def test_generalized_jsd_bad_input():
    with pytest.raises(ValueError, match=r"GKD beta must be in \[0, 1\], got 1.5"):
        generalized_jsd(torch.zeros(1, 2), torch.zeros(1, 2), beta=1.5)
    with pytest.raises(ValueError, match=r"GKD temperature must be > 0"):
        generalized_jsd(torch.zeros(1, 2), torch.zeros(1, 2), temperature=0.0)
    with pytest.raises(ValueError, match=r"student and teacher logits differ in shape"):
        generalized_jsd(torch.zeros(1, 2), torch.zeros(1, 3))


def test_group_token_baseline_is_leave_one_out_per_position():
    from lightning_grpo.core.distill import group_token_baseline

    adv = torch.tensor([[1.0, 2.0], [3.0, 4.0], [1.0, 5.0], [2.0, 7.0], [6.0, 9.0], [0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
    out = group_token_baseline(adv, mask, group_size=3)
    # group 0, t=0: [1, 3, 1] -> 1 - 2, 3 - 1, 1 - 2; t=1: [2, 4, 5] -> 2 - 4.5, 4 - 3.5, 5 - 3
    # group 1, t=0: rows 3, 4 valid -> 2 - 6, 6 - 2; t=1: only row 3 valid -> keeps 7
    close(out, [[-1.0, -2.5], [2.0, 0.5], [-1.0, 2.0], [-4.0, 7.0], [4.0, 0.0], [0.0, 0.0]])
    loop = adv.clone() * 0
    for i in range(6):
        g = i // 3
        for t in range(2):
            if mask[i, t]:
                others = [adv[j, t] for j in range(3 * g, 3 * g + 3) if j != i and mask[j, t]]
                loop[i, t] = adv[i, t] - (sum(others) / len(others) if others else 0.0)
    close(out, loop)
    with pytest.raises(ValueError, match=r"B divisible by group_size=4"):
        group_token_baseline(adv, mask, group_size=4)
