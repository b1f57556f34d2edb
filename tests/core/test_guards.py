"""Numerical guards: clamp_log_ratio and check_finite."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from lightning_grpo.core.guards import LOG_RATIO_LIMIT, NonFiniteError, check_finite, clamp_log_ratio

NAN, INF = float("nan"), float("inf")


def test_the_default_limit_is_verls():
    assert LOG_RATIO_LIMIT == 20.0


def test_clamp_log_ratio_values_and_default_limit():
    x = torch.tensor([-100.0, -20.5, -3.0, 0.0, 3.0, 20.5, 100.0])
    assert_close(clamp_log_ratio(x), torch.tensor([-20.0, -20.0, -3.0, 0.0, 3.0, 20.0, 20.0]), atol=0, rtol=0)
    assert_close(clamp_log_ratio(x, limit=5.0), torch.tensor([-5.0, -5.0, -3.0, 0.0, 3.0, 5.0, 5.0]), atol=0, rtol=0)
    # exp of the clamped value is finite where exp(100) overflows float32
    assert torch.isinf(torch.exp(x)).any()
    assert torch.isfinite(torch.exp(clamp_log_ratio(x))).all()
    assert_close(torch.exp(clamp_log_ratio(torch.tensor([100.0]))), torch.tensor([math.exp(20.0)]))


def test_clamp_log_ratio_gradient_is_one_inside_zero_outside():
    x = torch.tensor([-30.0, -1.0, 0.5, 30.0], requires_grad=True)
    clamp_log_ratio(x).sum().backward()
    assert_close(x.grad, torch.tensor([0.0, 1.0, 1.0, 0.0]), atol=0, rtol=0)


def test_clamp_log_ratio_keeps_dtype_and_rejects_bad_limit():
    x = torch.tensor([-50.0, 1.0, 50.0], dtype=torch.bfloat16)
    out = clamp_log_ratio(x)
    assert out.dtype == torch.bfloat16
    assert out.tolist() == [-20.0, 1.0, 20.0]
    with pytest.raises(ValueError):
        clamp_log_ratio(x, limit=0.0)


def test_check_finite_ignores_masked_positions():
    x = torch.tensor([[1.0, NAN, INF], [2.0, 3.0, -INF]])
    mask = torch.tensor([[1, 0, 0], [1, 1, 0]])
    check_finite("logp", x, mask)  # no error: the non-finite values are all on padding
    check_finite("logp", x, mask.bool())
    check_finite("logp", x, mask.float())


def test_check_finite_message_names_tensor_rows_and_count():
    x = torch.tensor([[1.0, NAN, 0.0], [0.0, 0.0, 0.0], [INF, -INF, 0.0], [NAN, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1], [0, 1, 1]])  # row 3's nan is masked
    with pytest.raises(NonFiniteError) as info:
        check_finite("old_logp", x, mask)
    msg = str(info.value)
    assert "old_logp" in msg
    assert "3 non-finite" in msg  # (0,1) nan, (2,0) inf, (2,1) -inf
    assert "[0, 2]" in msg
    assert isinstance(info.value, ValueError)


def test_check_finite_lists_first_rows_only():
    x = torch.full((12, 2), NAN)
    with pytest.raises(NonFiniteError) as info:
        check_finite("ref_logp", x, torch.ones(12, 2), max_rows=3)
    msg = str(info.value)
    assert "24 non-finite" in msg and "[0, 1, 2]" in msg and "+9 more rows" in msg


def test_check_finite_without_mask_and_bf16():
    with pytest.raises(NonFiniteError, match="entropy"):
        check_finite("entropy", torch.tensor([[0.0, INF]], dtype=torch.bfloat16))
    check_finite("ids", torch.tensor([[1, 2]]), torch.ones(1, 2))  # integers are always finite
    with pytest.raises(ValueError, match="shape"):
        check_finite("logp", torch.zeros(2, 3), torch.ones(2, 2))
