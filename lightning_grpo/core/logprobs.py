"""Token log-probabilities (and entropies) of sampled tokens, plus masked reductions.

For a sequence of logits z_t in R^V and the sampled token y_t, with temperature tau:

    log pi(y_t) = z_t[y_t] / tau - logsumexp(z_t / tau)
    H_t         = -sum_v p_v log p_v,   p = softmax(z_t / tau)

Two registered paths (registry ``LOGPROBS``) compute the same numbers; each entry's ``reads`` attribute says
what it scores (``"logits"`` or ``"hidden"`` states with the LM head), so a caller runs the model accordingly:

- ``"logits"``: from materialised logits [B, T, V] (float32 ``log_softmax`` then ``gather``).
- ``"chunked_hidden"``: from the final hidden states [B, T, H] and the LM head weight [V, H],
  ``chunk_size`` rows of the flattened B*T at a time, so the [B*T, V] logits never exist at
  once, neither in forward nor in backward (backward recomputes each chunk's logits). Peak
  extra memory is O(chunk_size * V) instead of O(B * T * V). ``save_probs=True`` trades that
  back for speed: the softmax [B*T, V] is kept for backward, which then skips the recompute.

All math is float32 (inputs in bf16/fp16 are upcast; float64 stays float64), following the
numerical guard "log-probs in float32 with log_softmax, never log of softmax".
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .registry import LOGPROBS
from .specs import LogProbSpec

__all__ = [
    "TokenLogProbs",
    "logprobs_from_logits",
    "logprobs_from_hidden",
    "masked_sum",
    "masked_mean",
    "masked_var",
]


class TokenLogProbs(NamedTuple):
    """Per-token log-probability of the sampled token and (optionally) the entropy."""

    logp: Tensor
    """[B, T] float32, log pi(y_t | context) of the sampled token y_t."""
    entropy: Tensor | None
    """[B, T] float32, entropy of the full next-token distribution; None if not asked."""


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half precisions (and float32), float64 for float64."""
    return torch.promote_types(dtype, torch.float32)


def _check_temperature(temperature: float) -> None:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


@LOGPROBS.register("logits", spec=LogProbSpec(reads="logits"))
def logprobs_from_logits(
    logits: Tensor, ids: Tensor, *, temperature: float = 1.0, compute_entropy: bool = False
) -> TokenLogProbs:
    """Log-probs of ``ids`` under ``softmax(logits / temperature)``, computed in float32.

    logp[b, t] = log_softmax(logits[b, t] / tau)[ids[b, t]]
    entropy[b, t] = -sum_v p_v log p_v with p = softmax(logits[b, t] / tau)

    Args:
        logits: [B, T, V] any float dtype (upcast to float32). Entries may be ``-inf``
            (masked vocabulary): those tokens get p = 0 and add 0 to the entropy.
        ids: [B, T] long, sampled token ids in [0, V).
        temperature: tau > 0, divides the logits (use the sampling temperature).
        compute_entropy: also return the entropy (differentiable).

    Returns:
        ``TokenLogProbs(logp [B, T], entropy [B, T] | None)``, float32.
    """
    _check_temperature(temperature)
    logits = logits.to(_compute_dtype(logits.dtype))
    logp_all = torch.log_softmax(logits / temperature, dim=-1)  # [B, T, V]
    logp = logp_all.gather(-1, ids.long().unsqueeze(-1)).squeeze(-1)  # [B, T]
    entropy = None
    if compute_entropy:
        # clamp keeps 0 * (-inf) out (p = 0 where logp = -inf) and its gradient finite
        finite_logp = logp_all.clamp(min=torch.finfo(logp_all.dtype).min)  # [B, T, V]
        entropy = -(logp_all.exp() * finite_logp).sum(-1)  # [B, T]
    return TokenLogProbs(logp, entropy)


def _chunk_logits(h: Tensor, w: Tensor, b: Tensor | None, temperature: float) -> Tensor:
    """z = (h @ w.T + b) / tau for one chunk: h [C, H], w [V, H], b [V] -> [C, V]."""
    z = torch.addmm(b, h, w.t()) if b is not None else h @ w.t()  # [C, V]
    if temperature != 1.0:
        z.div_(temperature)
    return z


class _ChunkedLogProbs(torch.autograd.Function):
    """Autograd function behind :func:`logprobs_from_hidden` (flattened rows N = B*T).

    forward saves hidden, weight, bias, ids and two floats per row (logsumexp, entropy);
    backward recomputes each chunk's logits from them. With ``save_probs`` forward also keeps
    the softmax [N, V] and backward reuses it: no second LM-head matmul and no second exp.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, ids, temperature, compute_entropy, chunk_size, save_probs):
        with torch.autocast(device_type=hidden.device.type, enabled=False):  # float32 even under AMP
            return _ChunkedLogProbs._forward(
                ctx, hidden, weight, bias, ids, temperature, compute_entropy, chunk_size, save_probs
            )

    @staticmethod
    def _forward(ctx, hidden, weight, bias, ids, temperature, compute_entropy, chunk_size, save_probs):
        # hidden [N, H], weight [V, H], bias [V] | None, ids [N]
        dtype = _compute_dtype(hidden.dtype)
        w = weight.to(dtype)  # [V, H], a no-op for float32
        b = bias.to(dtype) if bias is not None else None  # [V]
        n = hidden.shape[0]
        logp = hidden.new_empty(n, dtype=dtype)  # [N]
        lse = hidden.new_empty(n, dtype=dtype)  # [N]
        ent = hidden.new_empty(n if compute_entropy else 0, dtype=dtype)  # [N] or [0]
        probs = hidden.new_empty((n, w.shape[0]) if save_probs else (0,), dtype=dtype)  # [N, V] or [0]
        for s in range(0, n, chunk_size):
            e = min(s + chunk_size, n)
            z = _chunk_logits(hidden[s:e].to(dtype), w, b, temperature)  # [C, V]
            z_y = z.gather(1, ids[s:e].unsqueeze(1)).squeeze(1)  # [C]
            if save_probs:
                lse[s:e] = _softmax_into(z, probs[s:e], ent[s:e] if compute_entropy else None)
            else:
                lse[s:e] = torch.logsumexp(z, dim=-1)
                if compute_entropy:
                    z.sub_(lse[s:e, None])  # log p [C, V]
                    ent[s:e] = -z.exp().mul_(z).sum(-1)
            logp[s:e] = z_y - lse[s:e]
        ctx.save_for_backward(hidden, weight, bias, ids, lse, ent, probs)
        ctx.temperature = temperature
        ctx.chunk_size = chunk_size
        ctx.compute_entropy = compute_entropy
        ctx.save_probs = save_probs
        if not compute_entropy:
            ctx.mark_non_differentiable(ent)
        ctx.set_materialize_grads(False)
        return logp, ent

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_logp, grad_ent):
        with torch.autocast(device_type=ctx.saved_tensors[0].device.type, enabled=False):
            return _ChunkedLogProbs._backward(ctx, grad_logp, grad_ent)

    @staticmethod
    def _backward(ctx, grad_logp, grad_ent):
        # grad_logp [N] | None, grad_ent [N] | None
        hidden, weight, bias, ids, lse, ent, probs = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        if not ctx.compute_entropy:
            grad_ent = None
        dtype = lse.dtype
        w = weight.to(dtype)  # [V, H]
        b = bias.to(dtype) if bias is not None else None  # [V]
        n, tau = hidden.shape[0], ctx.temperature
        g_h = torch.zeros_like(hidden) if need_h else None  # [N, H] in hidden's dtype
        g_w = torch.zeros_like(w) if need_w else None  # [V, H] float32
        g_b = torch.zeros_like(b) if need_b else None  # [V] float32
        for s in range(0, n, ctx.chunk_size):
            e = min(s + ctx.chunk_size, n)
            h = hidden[s:e].to(dtype)  # [C, H]
            g_logp, g_ent, ent_c = _rows(grad_logp, s, e), _rows(grad_ent, s, e), None if grad_ent is None else ent[s:e]
            if ctx.save_probs:
                dz = _grad_from_probs(probs[s:e], ids[s:e], g_logp, g_ent, ent_c)  # [C, V]
            else:
                dz = _chunk_logits(h, w, b, tau).sub_(lse[s:e, None])  # log p [C, V]
                dz = _grad_wrt_logits(dz, ids[s:e], g_logp, g_ent, ent_c)
            dz.div_(tau)  # d/d(h W^T + b) = d/dz / tau
            if need_h:
                g_h[s:e] = (dz @ w).to(hidden.dtype)
            if need_w:
                g_w.addmm_(dz.t(), h)
            if need_b:
                g_b += dz.sum(0)
        g_w = g_w.to(weight.dtype) if need_w else None
        g_b = g_b.to(bias.dtype) if need_b else None
        return g_h, g_w, g_b, None, None, None, None, None


def _softmax_into(z: Tensor, out: Tensor, ent: Tensor | None) -> Tensor:
    """softmax(z) written into ``out`` (and the entropy into ``ent``), one exp per entry; returns
    logsumexp(z). z [C, V] (overwritten: z - max), out [C, V], ent [C] | None -> [C]."""
    top = z.amax(-1, keepdim=True)  # [C, 1] (a row has a finite logit: the sampled token was sampled)
    shifted = z.sub_(top)  # [C, V] <= 0
    torch.exp(shifted, out=out)
    total = out.sum(-1, keepdim=True)  # [C, 1] >= 1
    out.div_(total)  # p
    log_total = total.log()  # [C, 1]
    if ent is not None:  # H = -sum p (shifted - log total) = log total - sum p * shifted
        finite = shifted.clamp_(min=torch.finfo(z.dtype).min)  # p = 0 where shifted = -inf
        ent.copy_(log_total.squeeze(-1) - torch.linalg.vecdot(out, finite))
    return (top + log_total).squeeze(-1)


def _grad_from_probs(p: Tensor, ids: Tensor, g_logp: Tensor | None, g_ent: Tensor | None, ent: Tensor | None) -> Tensor:
    """:func:`_grad_wrt_logits` from the saved softmax p [C, V] (left unchanged) -> a new [C, V]."""
    if g_ent is not None:  # the entropy term needs log p: p = 0 entries add 0 (clamped log)
        return _grad_wrt_logits(p.log().clamp_(min=torch.finfo(p.dtype).min), ids, g_logp, g_ent, ent)
    if g_logp is None:
        return torch.zeros_like(p)
    dz = p.mul(-g_logp[:, None])  # [C, V]
    dz.scatter_add_(1, ids[:, None], g_logp[:, None].to(dz.dtype))
    return dz


def _rows(x: Tensor | None, s: int, e: int) -> Tensor | None:
    return None if x is None else x[s:e]


def _grad_wrt_logits(
    logp_all: Tensor,
    ids: Tensor,
    g_logp: Tensor | None,
    g_ent: Tensor | None,
    ent: Tensor | None,
) -> Tensor:
    """Gradient of sum_r (g_logp_r * logp_r + g_ent_r * H_r) w.r.t. the logits z, in place.

    d logp_y / dz = onehot(y) - p;  dH / dz = -p * (log p + H).
    So dL/dz = -p * (g_logp + g_ent * (log p + H)) + g_logp * onehot(y).
    logp_all [C, V] (overwritten), ids [C], g_logp/g_ent/ent [C] or None -> [C, V].
    """
    p = logp_all.exp()  # [C, V]
    if g_ent is not None:
        coef = logp_all.add_(ent[:, None]).mul_(g_ent[:, None])  # [C, V], reuses the buffer
        if g_logp is not None:
            coef.add_(g_logp[:, None])
        dz = coef.mul_(p).neg_()
    elif g_logp is not None:
        dz = p.mul_(-g_logp[:, None])
    else:
        return logp_all.zero_()
    if g_logp is not None:
        dz.scatter_add_(1, ids[:, None], g_logp[:, None].to(dz.dtype))
    return dz


@LOGPROBS.register("chunked_hidden", spec=LogProbSpec(reads="hidden"))
def logprobs_from_hidden(
    hidden: Tensor,
    weight: Tensor,
    ids: Tensor,
    *,
    bias: Tensor | None = None,
    temperature: float = 1.0,
    compute_entropy: bool = False,
    chunk_size: int = 1024,
    save_probs: bool = False,
) -> TokenLogProbs:
    """Log-probs of ``ids`` from final hidden states without materialising the full logits.

    z = (hidden @ weight.T + bias) / tau, computed ``chunk_size`` rows of the flattened B*T at a
    time, in float32:

    logp = z[y] - logsumexp(z);  entropy = -sum_v p_v log p_v,  p = softmax(z)

    Backward recomputes each chunk's logits (or reuses the saved softmax, ``save_probs``) and accumulates
    grad_hidden = dz @ W / tau, grad_weight = dz^T @ hidden / tau, grad_bias = sum_rows dz / tau,
    with dz = g_logp * (onehot(y) - p) - g_H * p * (log p + H). Peak extra memory is a few
    [chunk_size, V] float32 buffers plus a float32 [V, H] weight gradient accumulator (and,
    for a bf16/fp16 weight, a float32 [V, H] copy of it) (``save_probs``: plus [N, V] float32).
    Not twice differentiable.

    Args:
        hidden: [B, T, H] (any leading shape matching ``ids``) final hidden states, after the
            final norm. Gradient returned in hidden's dtype (None if it does not require grad).
        weight: [V, H] LM head weight; gradient in weight's dtype.
        ids: [B, T] long, sampled token ids in [0, V).
        bias: [V] LM head bias or None.
        temperature: tau > 0, divides the logits.
        compute_entropy: also return the entropy (differentiable).
        chunk_size: rows per chunk (of B*T); any positive int, need not divide B*T.
        save_probs: keep the softmax [N, V] from forward for backward instead of recomputing
            each chunk's logits there (only when a gradient is taken): one LM-head matmul and one
            exp per row less (on one CPU core, N = 800 rows of a 151k vocabulary: 1.45 s instead of
            1.91 s forward + backward, docs/evidence/performance.md), N * V floats more memory. Same numbers either way.

    Returns:
        ``TokenLogProbs(logp [B, T], entropy [B, T] | None)``, float32 (float64 for float64).
    """
    _check_temperature(temperature)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if hidden.shape[:-1] != ids.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} and ids {tuple(ids.shape)} disagree")
    flat_h = hidden.reshape(-1, hidden.shape[-1])  # [N, H]
    flat_ids = ids.reshape(-1).long()  # [N]
    grads = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (hidden, weight, bias))
    logp, ent = _ChunkedLogProbs.apply(
        flat_h, weight, bias, flat_ids, float(temperature), compute_entropy, int(chunk_size), save_probs and grads
    )
    entropy = ent.reshape(ids.shape) if compute_entropy else None
    return TokenLogProbs(logp.reshape(ids.shape), entropy)


def _masked_parts(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """(x with entries at mask == 0 set to 0, so nan/inf there cannot leak; mask), both in the
    compute dtype and broadcast to one shape."""
    dtype = _compute_dtype(x.dtype)
    x0 = torch.where(mask != 0, x.to(dtype), torch.zeros((), dtype=dtype, device=x.device))
    x0, m = torch.broadcast_tensors(x0, mask.to(dtype))
    return x0, m


def _reduce(x: Tensor, dim: int | tuple[int, ...] | None, keepdim: bool) -> Tensor:
    return x.sum() if dim is None else x.sum(dim, keepdim=keepdim)


def _safe_div(num: Tensor, den: Tensor) -> Tensor:
    """num / den where den > 0, else exactly 0 (no nan, and no nan in the gradient)."""
    ok = den > 0
    return torch.where(ok, num / torch.where(ok, den, torch.ones_like(den)), 0.0)


def masked_sum(x: Tensor, mask: Tensor, dim: int | tuple[int, ...] | None = None, keepdim: bool = False) -> Tensor:
    """sum(x * mask) over ``dim`` (all dims if None); float32 (upcast from half precisions).

    x [B, T], mask [B, T] bool or float (broadcastable to x). Values at mask == 0 are
    ignored even when they are nan/inf.
    """
    x0, m = _masked_parts(x, mask)
    return _reduce(x0 * m, dim, keepdim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | tuple[int, ...] | None = None, keepdim: bool = False) -> Tensor:
    """sum(x * mask) / sum(mask) over ``dim``; exactly 0 where sum(mask) == 0 (never nan).

    x [B, T], mask [B, T] bool or float -> scalar (dim None) or the reduced shape; float32.
    """
    x0, m = _masked_parts(x, mask)
    return _safe_div(_reduce(x0 * m, dim, keepdim), _reduce(m, dim, keepdim))


def masked_var(
    x: Tensor, mask: Tensor, dim: int | tuple[int, ...] | None = None, keepdim: bool = False, unbiased: bool = True
) -> Tensor:
    """sum(mask * (x - mean)^2) / (sum(mask) - 1 if unbiased else sum(mask)) over ``dim``.

    mean = masked_mean(x, mask, dim). Exactly 0 where the denominator is <= 0 (empty mask, or
    a single valid element when ``unbiased``), never nan. float32.
    """
    x0, m = _masked_parts(x, mask)
    mean = _safe_div(_reduce(x0 * m, dim, True), _reduce(m, dim, True))
    count = _reduce(m, dim, keepdim)
    total = _reduce(m * (x0 - mean) ** 2, dim, keepdim)
    return _safe_div(total, count - 1.0 if unbiased else count)
