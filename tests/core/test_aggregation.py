"""Loss aggregation modes: hand-worked values, loop references, micro-batch invariance, edge cases."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from lightning_grpo.core.aggregation import (
    seq_mean_token_mean,
    seq_mean_token_sum,
    seq_mean_token_sum_norm,
    token_mean,
)
from lightning_grpo.core.registry import AGGREGATIONS

NAN = float("nan")
MODES = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"]
MAX_LEN = 7


def _agg(name, loss, mask, **kw):
    return AGGREGATIONS.get(name)(loss, mask, max_length=MAX_LEN, **kw)


@pytest.fixture
def example():
    # row 0: 3 tokens, row 1: 2 tokens, row 2: empty. Masked entries hold junk (even nan).
    loss = torch.tensor([[1.0, 2.0, 3.0, NAN], [4.0, 5.0, 99.0, 0.0], [6.0, 0.0, NAN, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
    return loss, mask


def test_registered_names():
    assert AGGREGATIONS.names() == sorted(MODES)
    assert AGGREGATIONS.get("token_mean") is token_mean


def test_hand_worked_defaults(example):
    loss, mask = example
    assert_close(token_mean(loss, mask), torch.tensor((1.0 + 2.0 + 3.0 + 4.0 + 5.0) / 5.0), atol=1e-6, rtol=0)
    assert_close(
        seq_mean_token_mean(loss, mask),
        torch.tensor(((1.0 + 2.0 + 3.0) / 3.0 + (4.0 + 5.0) / 2.0 + 0.0) / 3.0),
        atol=1e-6,
        rtol=0,
    )
    assert_close(seq_mean_token_sum(loss, mask), torch.tensor((6.0 + 9.0 + 0.0) / 3.0), atol=1e-6, rtol=0)
    assert_close(seq_mean_token_sum_norm(loss, mask, max_length=4), torch.tensor(15.0 / (3.0 * 4.0)), atol=1e-6, rtol=0)


def test_hand_worked_global_counts(example):
    loss, mask = example
    assert_close(token_mean(loss, mask, num_tokens=10), torch.tensor(15.0 / 10.0), atol=1e-6, rtol=0)
    assert_close(token_mean(loss, mask, num_tokens=torch.tensor(6.0)), torch.tensor(2.5), atol=1e-6, rtol=0)
    assert_close(seq_mean_token_mean(loss, mask, num_sequences=5), torch.tensor((2.0 + 4.5) / 5.0), atol=1e-6, rtol=0)
    assert_close(seq_mean_token_sum(loss, mask, num_sequences=2), torch.tensor(15.0 / 2.0), atol=1e-6, rtol=0)
    assert_close(
        seq_mean_token_sum_norm(loss, mask, num_sequences=6, max_length=5),
        torch.tensor(15.0 / 30.0),
        atol=1e-6,
        rtol=0,
    )


def test_sum_norm_requires_max_length(example):
    loss, mask = example
    with pytest.raises(ValueError, match="max_length"):
        seq_mean_token_sum_norm(loss, mask)
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        token_mean(loss[0], mask[0])


def _loop_reference(name, loss, mask, num_tokens, num_sequences, max_length):
    rows = [[float(v) for v in r] for r in loss]
    ms = [[float(v) for v in r] for r in mask]
    n_seq = float(len(rows)) if num_sequences is None else float(num_sequences)
    total, tok, seq_means = 0.0, 0.0, 0.0
    for r, m in zip(rows, ms):
        s = sum(x * w for x, w in zip(r, m) if w != 0)
        n = sum(m)
        total += s
        tok += n
        seq_means += s / n if n > 0 else 0.0
    n_tok = tok if num_tokens is None else float(num_tokens)
    num = {
        "token_mean": (total, n_tok),
        "seq_mean_token_mean": (seq_means, n_seq),
        "seq_mean_token_sum": (total, n_seq),
        "seq_mean_token_sum_norm": (total, n_seq * max_length),
    }[name]
    return num[0] / num[1] if num[1] > 0 else 0.0


@pytest.mark.parametrize("name", MODES)
@pytest.mark.parametrize("counts", [(None, None), (37.0, 11.0)])
def test_matches_loop_reference(name, counts):
    g = torch.Generator().manual_seed(0)
    loss = torch.randn(6, MAX_LEN, generator=g)
    lengths = [0, 1, 7, 3, 5, 2]
    mask = (torch.arange(MAX_LEN)[None, :] < torch.tensor(lengths)[:, None]).float()
    out = _agg(name, loss, mask, num_tokens=counts[0], num_sequences=counts[1])
    expected = _loop_reference(name, loss, mask, counts[0], counts[1], MAX_LEN)
    assert out.dtype == torch.float32 and out.dim() == 0
    assert_close(out, torch.tensor(expected), atol=1e-6, rtol=0)


def _uneven_batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([3, 0, 7, 1, 5, 6, 2, 4])  # row 1 empty
    mask = (torch.arange(MAX_LEN)[None, :] < lengths[:, None]).float()  # [8, 7]
    loss = torch.randn(8, MAX_LEN, generator=g)
    return loss, mask


@pytest.mark.parametrize("name", MODES)
def test_micro_batch_invariance_values_and_grads(name):
    """k uneven micro-batches, each given the global counts, summed == one batch (value and grad)."""
    base, mask = _uneven_batch()
    num_tokens, num_sequences = mask.sum(), mask.shape[0]

    whole = base.clone().requires_grad_(True)
    full = _agg(name, whole, mask)  # defaults are the global counts for the whole batch
    full.backward()

    parts = base.clone().requires_grad_(True)
    total = torch.zeros(())
    for rows in (slice(0, 3), slice(3, 4), slice(4, 8)):  # 3 + 1 + 4 rows
        piece = _agg(name, parts[rows], mask[rows], num_tokens=num_tokens, num_sequences=num_sequences)
        piece.backward()
        total = total + piece.detach()

    assert_close(total, full.detach(), atol=1e-6, rtol=0)
    assert_close(parts.grad, whole.grad, atol=1e-6, rtol=0)


def test_local_counts_are_not_invariant():
    """Sanity check that the invariance test can fail: local normalisers change the token-mean."""
    loss, mask = _uneven_batch()
    full = token_mean(loss, mask)
    pieces = sum(token_mean(loss[r], mask[r]) for r in (slice(0, 3), slice(3, 4), slice(4, 8))) / 3
    assert (pieces - full).abs() > 1e-3


@pytest.mark.parametrize("name", MODES)
def test_all_masked_gives_zero_and_zero_grad(name):
    loss = torch.randn(3, 4).requires_grad_(True)
    out = _agg(name, loss, torch.zeros(3, 4))
    out.backward()
    assert out.item() == 0.0
    assert_close(loss.grad, torch.zeros(3, 4), atol=0, rtol=0)


@pytest.mark.parametrize("name", MODES)
def test_zero_denominators_and_empty_batch(name):
    loss = torch.ones(2, 3, requires_grad=True)
    out = _agg(name, loss, torch.ones(2, 3), num_tokens=0, num_sequences=0)
    out.backward()
    assert out.item() == 0.0 and torch.isfinite(loss.grad).all()
    assert loss.grad.abs().sum().item() == 0.0
    empty = _agg(name, torch.zeros(0, 3), torch.zeros(0, 3))
    assert empty.item() == 0.0


@pytest.mark.parametrize("name", MODES)
def test_masked_nan_does_not_leak_into_value_or_grad(name, example):
    loss, mask = example
    leaf = loss.clone().requires_grad_(True)
    out = _agg(name, leaf, mask)
    out.backward()
    assert torch.isfinite(out) and torch.isfinite(leaf.grad).all()
    assert (leaf.grad[mask == 0] == 0).all()


def test_seq_mean_token_mean_gradient_by_hand(example):
    loss, mask = example
    leaf = loss.clone().requires_grad_(True)
    seq_mean_token_mean(leaf, mask).backward()
    # d/dL_it = 1 / (|o_i| * B): row 0 -> 1/9, row 1 -> 1/6, row 2 (empty) -> 0
    expected = torch.tensor([[1 / 9, 1 / 9, 1 / 9, 0.0], [1 / 6, 1 / 6, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    assert_close(leaf.grad, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", MODES)
def test_bf16_inputs_and_bool_mask(name):
    loss, mask = _uneven_batch(seed=3)
    loss16 = loss.to(torch.bfloat16)
    out = _agg(name, loss16, mask.bool())
    assert out.dtype == torch.float32
    assert_close(out, _agg(name, loss16.float(), mask), atol=1e-6, rtol=0)
