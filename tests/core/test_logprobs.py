"""Tests for lightning_grpo.core.logprobs: hand-worked values, chunked == full-logits path
(values and gradients), gradcheck, bf16, and masked reductions."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from lightning_grpo.core.logprobs import (
    TokenLogProbs,
    logprobs_from_hidden,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
)
from lightning_grpo.core.registry import LOGPROBS

# ---------------------------------------------------------------- hand-worked V = 3 example
# logits z = (ln 1, ln 3, ln 4) -> p = (1/8, 3/8, 4/8); sampled token y = 1.
Z = [0.0, math.log(3.0), math.log(4.0)]
LOGP_Y = math.log(3.0 / 8.0)
ENTROPY = -(1 / 8 * math.log(1 / 8) + 3 / 8 * math.log(3 / 8) + 4 / 8 * math.log(4 / 8))
# temperature 2: z / 2 = (0, ln sqrt3, ln 2) -> p = (1, sqrt3, 2) / (3 + sqrt3)
S = 3.0 + math.sqrt(3.0)
P_T2 = [1.0 / S, math.sqrt(3.0) / S, 2.0 / S]
LOGP_Y_T2 = math.log(P_T2[1])
ENTROPY_T2 = -sum(p * math.log(p) for p in P_T2)


def _hand_inputs():
    logits = torch.tensor([[Z]])  # [B=1, T=1, V=3]
    ids = torch.tensor([[1]])  # [1, 1]
    return logits, ids


@pytest.mark.parametrize("temperature, logp, entropy", [(1.0, LOGP_Y, ENTROPY), (2.0, LOGP_Y_T2, ENTROPY_T2)])
def test_hand_values_both_paths(temperature, logp, entropy):
    logits, ids = _hand_inputs()
    expected_logp = torch.tensor([[logp]])
    expected_ent = torch.tensor([[entropy]])
    out = logprobs_from_logits(logits, ids, temperature=temperature, compute_entropy=True)
    assert isinstance(out, TokenLogProbs)
    assert_close(out.logp, expected_logp, atol=1e-6, rtol=0)
    assert_close(out.entropy, expected_ent, atol=1e-6, rtol=0)
    # hidden path: weight = identity so hidden == logits
    out = logprobs_from_hidden(logits, torch.eye(3), ids, temperature=temperature, compute_entropy=True)
    assert_close(out.logp, expected_logp, atol=1e-6, rtol=0)
    assert_close(out.entropy, expected_ent, atol=1e-6, rtol=0)
    # bias path: hidden = 0, bias = logits
    out = logprobs_from_hidden(
        torch.zeros(1, 1, 2), torch.ones(3, 2), ids, bias=logits[0, 0], temperature=temperature, compute_entropy=True
    )
    assert_close(out.logp, expected_logp, atol=1e-6, rtol=0)
    assert_close(out.entropy, expected_ent, atol=1e-6, rtol=0)


def test_hand_gradients():
    # d logp_y / dz = onehot(y) - p = (-1/8, 1 - 3/8, -4/8)
    # dH / dz_j = -p_j (ln p_j + H)
    p = [1 / 8, 3 / 8, 4 / 8]
    d_logp = [-1 / 8, 5 / 8, -4 / 8]
    d_ent = [-pj * (math.log(pj) + ENTROPY) for pj in p]
    for fn in ("logits", "hidden"):
        z = torch.tensor([[Z]], requires_grad=True)
        ids = torch.tensor([[1]])
        if fn == "logits":
            out = logprobs_from_logits(z, ids, compute_entropy=True)
        else:
            out = logprobs_from_hidden(z, torch.eye(3), ids, compute_entropy=True)
        (g_logp,) = torch.autograd.grad(out.logp.sum(), z, retain_graph=True)
        (g_ent,) = torch.autograd.grad(out.entropy.sum(), z)
        assert_close(g_logp, torch.tensor([[d_logp]]), atol=1e-6, rtol=0)
        assert_close(g_ent, torch.tensor([[d_ent]]), atol=1e-6, rtol=0)


# ------------------------------------------------------------ chunked == full-logits path
def _random_case(B=3, T=5, H=8, V=13, seed=0, dtype=torch.float32, bias=True):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=g).to(dtype)
    weight = (0.5 * torch.randn(V, H, generator=g)).to(dtype)
    b = torch.randn(V, generator=g).to(dtype) if bias else None
    ids = torch.randint(0, V, (B, T), generator=g)
    # random upstream gradients for a loss that uses both logp and entropy
    c_logp = torch.randn(B, T, generator=g)
    c_ent = torch.randn(B, T, generator=g)
    return hidden, weight, b, ids, c_logp, c_ent


def _loss_and_grads(out, c_logp, c_ent, params):
    loss = (c_logp * out.logp).sum()
    if out.entropy is not None:
        loss = loss + (c_ent * out.entropy).sum()
    return torch.autograd.grad(loss, params)


@pytest.mark.parametrize("chunk_size", [1, 4, 7, 15, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("use_bias", [False, True])
@pytest.mark.parametrize("compute_entropy", [False, True])
@pytest.mark.parametrize("save_probs", [False, True])
def test_chunked_matches_logits_path(chunk_size, temperature, use_bias, compute_entropy, save_probs):
    hidden, weight, bias, ids, c_logp, c_ent = _random_case(bias=use_bias)
    params = [t.requires_grad_() for t in (hidden, weight, bias) if t is not None]
    kw = dict(temperature=temperature, compute_entropy=compute_entropy)
    out = logprobs_from_hidden(hidden, weight, ids, bias=bias, chunk_size=chunk_size, save_probs=save_probs, **kw)
    logits = hidden @ weight.T + (bias if bias is not None else 0.0)  # [B, T, V]
    ref = logprobs_from_logits(logits, ids, **kw)
    assert out.logp.dtype == torch.float32 and out.logp.shape == ids.shape
    assert_close(out.logp, ref.logp, atol=1e-6, rtol=0)
    if compute_entropy:
        assert_close(out.entropy, ref.entropy, atol=1e-6, rtol=0)
    else:
        assert out.entropy is None
    grads = _loss_and_grads(out, c_logp, c_ent, params)
    ref_grads = _loss_and_grads(ref, c_logp, c_ent, params)
    for g, r in zip(grads, ref_grads):
        assert_close(g, r, atol=1e-5, rtol=0)


def test_entropy_only_loss():
    """Loss on the entropy alone: the logp output gets no upstream gradient."""
    hidden, weight, bias, ids, _, c_ent = _random_case()
    params = [hidden.requires_grad_(), weight.requires_grad_(), bias.requires_grad_()]
    out = logprobs_from_hidden(hidden, weight, ids, bias=bias, compute_entropy=True, chunk_size=4)
    ref = logprobs_from_logits(hidden @ weight.T + bias, ids, compute_entropy=True)
    grads = torch.autograd.grad((c_ent * out.entropy).sum(), params)
    ref_grads = torch.autograd.grad((c_ent * ref.entropy).sum(), params)
    for g, r in zip(grads, ref_grads):
        assert_close(g, r, atol=1e-5, rtol=0)


@pytest.mark.parametrize("trainable", ["hidden", "weight"])
def test_partial_requires_grad(trainable):
    hidden, weight, bias, ids, c_logp, _ = _random_case()
    target = hidden if trainable == "hidden" else weight
    target.requires_grad_()
    out = logprobs_from_hidden(hidden, weight, ids, bias=bias, chunk_size=4)
    (c_logp * out.logp).sum().backward()
    ref_target = target.detach().clone().requires_grad_()
    h, w = (ref_target, weight) if trainable == "hidden" else (hidden, ref_target)
    (c_logp * logprobs_from_logits(h @ w.T + bias, ids).logp).sum().backward()
    assert_close(target.grad, ref_target.grad, atol=1e-5, rtol=0)
    other = weight if trainable == "hidden" else hidden
    assert other.grad is None


def _saved_sizes(fn) -> list[int]:
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return saved


def test_saves_no_full_logits():
    """Forward keeps only the inputs and two floats per row, never a [B*T, V] tensor."""
    hidden, weight, bias, ids, _, _ = _random_case(B=4, T=6, H=3, V=50)
    hidden.requires_grad_()
    saved = _saved_sizes(
        lambda: logprobs_from_hidden(hidden, weight, ids, bias=bias, compute_entropy=True, chunk_size=5)
    )
    n = 4 * 6
    assert sorted(saved) == sorted([hidden.numel(), weight.numel(), bias.numel(), n, n, n, 0])  # 0: no saved softmax
    assert max(saved) < n * 50


def test_save_probs_keeps_the_softmax_only_when_a_gradient_is_taken(monkeypatch):
    """save_probs: forward keeps the [B*T, V] softmax for backward (the same numbers as recomputing, above);
    without a gradient to take (no_grad, or no input that requires one) it builds no softmax at all."""
    from lightning_grpo.core import logprobs as module

    built = []
    monkeypatch.setattr(
        module,
        "_softmax_into",
        lambda z, out, ent, real=module._softmax_into: built.append(out.shape) or real(z, out, ent),
    )
    hidden, weight, bias, ids, _, _ = _random_case(B=4, T=6, H=3, V=50)

    def call():
        return logprobs_from_hidden(hidden, weight, ids, bias=bias, compute_entropy=True, chunk_size=5, save_probs=True)

    assert call().logp.grad_fn is None and built == []  # nothing requires a gradient
    hidden.requires_grad_()
    with torch.no_grad():
        call()
    assert built == []
    n = 4 * 6
    assert sorted(_saved_sizes(call)) == sorted([hidden.numel(), weight.numel(), bias.numel(), n, n, n, n * 50])
    assert len(built) == 5  # 24 rows in chunks of 5
    probs = logprobs_from_logits(hidden.detach() @ weight.T + bias, ids).logp.exp()  # [B, T] p of the sampled tokens
    assert_close(call().logp.exp(), probs, atol=1e-6, rtol=0)


def test_save_probs_with_extreme_and_masked_logits_stays_finite():
    """Saved softmax entries that underflow to 0 (logit -1000, or -inf through the bias) add nothing to the
    entropy or its gradient."""
    for hidden, weight, bias, y in [
        (torch.tensor([[1000.0, -1000.0, 0.0]]), torch.eye(3), None, 1),
        (torch.zeros(1, 1), torch.zeros(3, 1), torch.tensor([0.0, float("-inf"), 1.0]), 2),
    ]:
        leaf = hidden if bias is None else bias
        leaf.requires_grad_()
        ids = torch.tensor([y])
        out = logprobs_from_hidden(hidden, weight, ids, bias=bias, compute_entropy=True, save_probs=True)
        logits = (hidden @ weight.T if bias is None else bias[None]).detach().requires_grad_()  # [1, 3]
        ref = logprobs_from_logits(logits, ids, compute_entropy=True)
        assert_close(out.logp, ref.logp, atol=1e-4, rtol=0)
        assert_close(out.entropy, ref.entropy, atol=1e-6, rtol=0)
        (out.logp.sum() + out.entropy.sum()).backward()
        assert torch.isfinite(leaf.grad).all()
    e = math.e  # the -inf row: p = (1, 0, e) / (1 + e), y = 2: d logp / dz = onehot - p; dH / dz = -p (log p + H)
    p = torch.tensor([1 / (1 + e), 0.0, e / (1 + e)])
    h = -(p[0] * p[0].log() + p[2] * p[2].log())
    expected = torch.tensor([0.0, 0.0, 1.0]) - p - p * (p.clamp(min=1e-30).log() + h)
    assert_close(bias.grad, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("save_probs", [False, True])
def test_gradcheck_float64(save_probs):
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(2, 3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(5, generator=g, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 5, (2, 3), generator=g)

    def fn(h, w, b):
        out = logprobs_from_hidden(
            h, w, ids, bias=b, temperature=0.7, compute_entropy=True, chunk_size=4, save_probs=save_probs
        )
        return out.logp, out.entropy

    assert torch.autograd.gradcheck(fn, (hidden, weight, bias), eps=1e-6, atol=1e-7)


def test_bf16_inputs():
    """bf16 hidden/weight: math in float32 on the bf16 values, so values match the float32
    path on the same (upcast) numbers to 1e-5; gradients come back in bf16, so they match
    the float32 gradients up to bf16 rounding (rtol 2**-7, atol 1e-3)."""
    hidden, weight, bias, ids, c_logp, c_ent = _random_case(dtype=torch.bfloat16)
    params = [t.requires_grad_() for t in (hidden, weight, bias)]
    out = logprobs_from_hidden(hidden, weight, ids, bias=bias, compute_entropy=True, chunk_size=4)
    assert out.logp.dtype == torch.float32 and out.entropy.dtype == torch.float32
    params32 = [t.detach().float().requires_grad_() for t in params]
    h32, w32, b32 = params32
    ref = logprobs_from_logits(h32 @ w32.T + b32, ids, compute_entropy=True)
    assert_close(out.logp, ref.logp, atol=1e-5, rtol=0)
    assert_close(out.entropy, ref.entropy, atol=1e-5, rtol=0)
    grads = _loss_and_grads(out, c_logp, c_ent, params)
    ref_grads = _loss_and_grads(ref, c_logp, c_ent, params32)
    for g, r in zip(grads, ref_grads):
        assert g.dtype == torch.bfloat16
        assert_close(g.float(), r, atol=1e-3, rtol=2**-7)
    # the logits path upcasts bf16 logits before log_softmax
    logits = (h32 @ w32.T + b32).detach()
    out16 = logprobs_from_logits(logits.bfloat16(), ids, compute_entropy=True)
    ref16 = logprobs_from_logits(logits.bfloat16().float(), ids, compute_entropy=True)
    assert out16.logp.dtype == torch.float32
    assert_close(out16.logp, ref16.logp, atol=0, rtol=0)


def test_extreme_and_masked_logits_finite():
    logits = torch.tensor([[[1000.0, -1000.0, 0.0], [0.0, float("-inf"), 1.0]]], requires_grad=True)  # [1, 2, 3]
    ids = torch.tensor([[1, 2]])
    out = logprobs_from_logits(logits, ids, compute_entropy=True)
    assert torch.isfinite(out.logp).all() and torch.isfinite(out.entropy).all()
    # row 0: logp of -1000 is -2000; row 1: p = (1, 0, e) / (1 + e)
    e = math.e
    assert_close(out.logp, torch.tensor([[-2000.0, math.log(e / (1 + e))]]), atol=1e-4, rtol=0)
    h1 = -(1 / (1 + e) * math.log(1 / (1 + e)) + e / (1 + e) * math.log(e / (1 + e)))
    assert_close(out.entropy[0, 1], torch.tensor(h1), atol=1e-6, rtol=0)
    (out.logp.sum() + out.entropy.sum()).backward()
    assert torch.isfinite(logits.grad).all()


def test_argument_checks():
    hidden, weight, bias, ids, _, _ = _random_case()
    with pytest.raises(ValueError, match="chunk_size"):
        logprobs_from_hidden(hidden, weight, ids, chunk_size=0)
    with pytest.raises(ValueError, match="temperature"):
        logprobs_from_hidden(hidden, weight, ids, temperature=0.0)
    with pytest.raises(ValueError, match="temperature"):
        logprobs_from_logits(hidden, ids, temperature=-1.0)
    with pytest.raises(ValueError, match="disagree"):
        logprobs_from_hidden(hidden, weight, ids[:, :-1])


def test_registry_names():
    assert LOGPROBS.get("logits") is logprobs_from_logits
    assert LOGPROBS.get("chunked_hidden") is logprobs_from_hidden


# ------------------------------------------------------------------------ masked reductions
X = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 10.0, 11.0, 12.0]])
M = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.bool)


def test_masked_sum_mean_hand_values():
    assert_close(masked_sum(X, M), torch.tensor(1.0 + 2 + 5 + 6 + 7 + 8), atol=1e-6, rtol=0)
    assert_close(masked_sum(X, M, dim=1), torch.tensor([3.0, 26.0, 0.0]), atol=1e-6, rtol=0)
    assert_close(masked_mean(X, M), torch.tensor(29.0 / 6.0), atol=1e-6, rtol=0)
    assert_close(masked_mean(X, M, dim=1), torch.tensor([1.5, 6.5, 0.0]), atol=1e-6, rtol=0)
    assert_close(masked_mean(X, M.float(), dim=1, keepdim=True), torch.tensor([[1.5], [6.5], [0.0]]), atol=1e-6, rtol=0)
    assert_close(masked_mean(X, M, dim=0), torch.tensor([3.0, 4.0, 7.0, 8.0]), atol=1e-6, rtol=0)


def test_masked_var_hand_values():
    # row 0: {1, 2}: mean 1.5, sum sq 0.5 -> unbiased 0.5, biased 0.25
    # row 1: {5, 6, 7, 8}: mean 6.5, sum sq 5.0 -> unbiased 5/3, biased 1.25; row 2 empty -> 0
    assert_close(masked_var(X, M, dim=1), torch.tensor([0.5, 5.0 / 3.0, 0.0]), atol=1e-6, rtol=0)
    assert_close(masked_var(X, M, dim=1, unbiased=False), torch.tensor([0.25, 1.25, 0.0]), atol=1e-6, rtol=0)
    one = torch.tensor([[1, 0, 0, 0]] * 3, dtype=torch.bool)
    assert_close(masked_var(X, one, dim=1), torch.zeros(3), atol=0, rtol=0)


def test_empty_mask_is_zero_not_nan():
    x = torch.tensor([[float("nan"), float("inf"), 3.0]], requires_grad=True)
    empty = torch.zeros(1, 3)
    for fn in (masked_sum, masked_mean, masked_var):
        out = fn(x, empty)
        assert_close(out, torch.tensor(0.0), atol=0, rtol=0)
        (g,) = torch.autograd.grad(out, x)
        assert_close(g, torch.zeros(1, 3), atol=0, rtol=0)
    # nan/inf at masked positions do not leak into the valid ones (value or gradient)
    mask = torch.tensor([[0.0, 0.0, 1.0]])
    out = masked_mean(x, mask)
    assert_close(out, torch.tensor(3.0), atol=0, rtol=0)
    (g,) = torch.autograd.grad(out, x)
    assert_close(g, torch.tensor([[0.0, 0.0, 1.0]]), atol=0, rtol=0)


def _loop_masked_mean(x, mask):
    out = []
    for i in range(x.shape[0]):
        vals = [float(x[i, t]) for t in range(x.shape[1]) if mask[i, t]]
        out.append(sum(vals) / len(vals) if vals else 0.0)
    return torch.tensor(out)


def _loop_masked_var(x, mask):
    out = []
    for i in range(x.shape[0]):
        vals = [float(x[i, t]) for t in range(x.shape[1]) if mask[i, t]]
        if len(vals) < 2:
            out.append(0.0)
            continue
        mu = sum(vals) / len(vals)
        out.append(sum((v - mu) ** 2 for v in vals) / (len(vals) - 1))
    return torch.tensor(out)


def test_masked_reductions_match_loop():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 9, generator=g)
    mask = torch.rand(6, 9, generator=g) > 0.5
    mask[0] = False
    mask[1] = False
    mask[1, 4] = True
    assert_close(masked_mean(x, mask, dim=1), _loop_masked_mean(x, mask), atol=1e-6, rtol=0)
    assert_close(masked_var(x, mask, dim=1), _loop_masked_var(x, mask), atol=1e-6, rtol=0)
    total = sum(float(x[i, t]) for i in range(6) for t in range(9) if mask[i, t])
    assert_close(masked_sum(x, mask), torch.tensor(total), atol=1e-5, rtol=0)


def test_masked_mean_bf16_returns_float32():
    x = torch.tensor([[1.0, 2.0, 4.0]], dtype=torch.bfloat16)
    mask = torch.tensor([[1, 1, 1]])
    out = masked_mean(x, mask)
    assert out.dtype == torch.float32
    assert_close(out, torch.tensor(7.0 / 3.0), atol=1e-6, rtol=0)


def test_chunked_path_stays_float32_under_autocast():
    import torch

    from lightning_grpo.core import logprobs_from_hidden

    torch.manual_seed(0)
    hidden = torch.randn(2, 5, 16, requires_grad=True)
    weight = torch.randn(30, 16, requires_grad=True)
    ids = torch.randint(0, 30, (2, 5))
    plain = logprobs_from_hidden(hidden, weight, ids, compute_entropy=True)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        amp = logprobs_from_hidden(hidden, weight, ids, compute_entropy=True)
    torch.testing.assert_close(amp.logp, plain.logp, atol=1e-6, rtol=0)
    (g_plain,) = torch.autograd.grad(plain.logp.sum(), hidden)
    (g_amp,) = torch.autograd.grad(amp.logp.sum(), hidden)
    torch.testing.assert_close(g_amp, g_plain, atol=1e-6, rtol=0)
