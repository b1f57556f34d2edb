"""Token terms (entropy bonus, LLDS), the top-entropy mask and the negative-advantage scale."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_grpo.core.registry import TOKEN_MASKS, TOKEN_TERMS
from lightning_grpo.core.terms import entropy_bonus, llds, scale_negative_advantages, top_entropy_mask


def close(actual, expected, atol=1e-6):
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=0)


def test_registered_names():
    assert TOKEN_TERMS.get("entropy_bonus") is entropy_bonus
    assert TOKEN_TERMS.get("llds") is llds
    assert TOKEN_MASKS.get("top_entropy") is top_entropy_mask


# ---------------------------------------------------------------- entropy bonus
def test_entropy_bonus_hand_worked_and_gradient():
    h = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    out = entropy_bonus(h, mask, 0.01)
    close(out, [[-0.01 * 1.0, 0.0], [-0.01 * 3.0, -0.01 * 4.0]])
    out.sum().backward()
    close(h.grad, [[-0.01, 0.0], [-0.01, -0.01]])


def test_entropy_bonus_bf16_bool_mask_and_nan_padding():
    h = torch.tensor([[0.5, float("nan")]], dtype=torch.bfloat16)
    out = entropy_bonus(h, torch.tensor([[True, False]]), 0.1)
    assert out.dtype == torch.float32
    close(out, [[-0.1 * 0.5, 0.0]])


# ---------------------------------------------------------------- LLDS
def test_llds_hand_worked():
    old = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
    d = torch.tensor(
        [
            [-0.5, 0.2, 0.1],  # sum -0.2 < 0: response fell; only token 0 fell
            [-0.5, 0.7, -9.0],  # valid sum 0.2 >= 0 (the -9 is masked): untouched
            [-0.3, -0.1, 0.0],  # sum -0.4: tokens 0 and 1 fell
            [-5.0, -5.0, -5.0],  # all masked
        ]
    )
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    logp = (old + d).requires_grad_(True)
    out = llds(logp, old, mask, 0.1)
    close(out, [[0.1 * 0.5, 0.0, 0.0], [0.0, 0.0, 0.0], [0.1 * 0.3, 0.1 * 0.1, 0.0], [0.0, 0.0, 0.0]])
    out.sum().backward()
    close(logp.grad, [[-0.1, 0.0, 0.0], [0.0, 0.0, 0.0], [-0.1, -0.1, 0.0], [0.0, 0.0, 0.0]])


def test_llds_matches_loop():
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(8, 6, generator=g) * 2
    logp = old + 0.2 * torch.randn(8, 6, generator=g)
    mask = (torch.rand(8, 6, generator=g) > 0.3).float()
    out = llds(logp, old, mask, 0.5)
    expected = [[0.0] * 6 for _ in range(8)]
    for i in range(8):
        ds = [float(logp[i, t] - old[i, t]) if mask[i, t] else 0.0 for t in range(6)]
        if sum(ds) < 0:
            for t in range(6):
                if mask[i, t]:
                    expected[i][t] = 0.5 * max(0.0, -ds[t])
    close(out, expected)


def test_llds_bf16_and_on_policy_zero():
    logp = torch.randn(3, 4).bfloat16()
    out = llds(logp, logp, torch.ones(3, 4), 1.0)
    assert out.dtype == torch.float32 and (out == 0).all()  # on-policy: nothing fell


# ---------------------------------------------------------------- top-entropy mask
def test_top_entropy_hand_worked():
    # ten valid entropies 0.1 .. 1.0, plus two masked ones that are larger than all of them
    h = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0.7, 0.8, 0.9, 1.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0] * 6, [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]])
    # q = 0.8: position 0.8 * 9 = 7.2 between sorted[7] = 0.8 and sorted[8] = 0.9 -> 0.82
    out = top_entropy_mask(h, mask, 0.8)
    assert out.dtype == torch.float32
    close(out, [[0.0] * 6, [0.0, 0.0, 1.0, 1.0, 0.0, 0.0]])  # the top 20%: 0.9 and 1.0
    # q = 0 keeps every valid token, q = 1 only the maximum
    close(top_entropy_mask(h, mask, 0.0), mask)
    close(top_entropy_mask(h, mask, 1.0), [[0.0] * 6, [0.0, 0.0, 0.0, 1.0, 0.0, 0.0]])


def test_top_entropy_matches_torch_quantile_and_trl_rho():
    g = torch.Generator().manual_seed(1)
    h = torch.rand(16, 32, generator=g) * 3
    mask = torch.rand(16, 32, generator=g) > 0.3
    for q in (0.0, 0.13, 0.5, 0.8, 0.97, 1.0):
        thr = torch.quantile(h[mask], q)
        close(top_entropy_mask(h, mask, q), ((h >= thr) & mask).float())
    # TRL: top_entropy_quantile rho keeps the top rho fraction -> our q = 1 - rho
    rho = 0.2
    kept = top_entropy_mask(h, mask, 1 - rho).sum() / mask.sum()
    assert abs(kept.item() - rho) < 1.5 / mask.sum().item()


def test_top_entropy_empty_mask_and_bf16():
    h = torch.tensor([[0.1, 0.5, 0.9], [0.3, 0.7, 0.2]]).bfloat16()
    assert (top_entropy_mask(h, torch.zeros(2, 3), 0.8) == 0).all()
    out = top_entropy_mask(h, torch.ones(2, 3), 0.5)
    close(out, [[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])  # threshold (0.3 + 0.5) / 2: the top half
    with pytest.raises(ValueError):
        top_entropy_mask(h, torch.ones(2, 3), 1.5)


# ---------------------------------------------------------------- negative advantages
def test_scale_negative_advantages():
    a = torch.tensor([1.0, -1.0, 0.0, -0.5])
    close(scale_negative_advantages(a, 0.0), [1.0, 0.0, 0.0, 0.0])  # +1/-1 -> +1/0
    close(scale_negative_advantages(a, 0.5), [1.0, -0.5, 0.0, -0.25])
    close(scale_negative_advantages(a, 1.0), a)
    a2 = torch.tensor([[2.0, -2.0], [-4.0, 0.5]])
    close(scale_negative_advantages(a2, 0.25), [[2.0, -0.5], [-1.0, 0.5]])
    with pytest.raises(ValueError):
        scale_negative_advantages(a, -1.0)


def test_scale_negative_advantages_bf16_keeps_dtype():
    a = torch.tensor([1.0, -2.0], dtype=torch.bfloat16)
    out = scale_negative_advantages(a, 0.5)
    assert out.dtype == torch.bfloat16
    assert out.tolist() == [1.0, -1.0]
    assert not math.isnan(out.sum().item())
