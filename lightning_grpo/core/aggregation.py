"""Aggregation of a per-token loss L [B, T] into one scalar (verl ``loss_agg_mode``, TRL ``loss_type``).

With m = mask [B, T] (1 on completion tokens), |o_i| = sum_t m_it and B rows:

    token_mean               sum_it L*m / N_tok                           (DAPO; TRL "dapo"/"bnpo")
    seq_mean_token_mean      sum_i (sum_t L*m)_i / |o_i|  /  N_seq        (original GRPO; TRL "grpo")
    seq_mean_token_sum       sum_i (sum_t L*m)_i  /  N_seq                (verl)
    seq_mean_token_sum_norm  sum_it L*m / (N_seq * max_length)            (Dr.GRPO; TRL "dr_grpo")

N_tok = ``num_tokens`` and N_seq = ``num_sequences`` when given, else the local sum(mask) and B.

Gradient accumulation / data parallelism: every formula is a sum over rows of a per-row term
divided by a constant. So when a global batch is split into k micro-batches (or ranks) and
each is aggregated with the *global* ``num_tokens`` / ``num_sequences``, the k results sum to
the one-batch value, and so do their gradients. Without the global counts each micro-batch
normalises by its own counts, and the sum (or mean) of the pieces is not the one-batch loss
(e.g. token_mean then weights short micro-batches' tokens more).

Departures and choices:
- The default N_seq is B, all rows, including rows whose mask is all 0 (TRL's ``.mean()``).
  verl's ``agg_loss`` instead divides by the number of non-empty rows when no global batch
  size is given. Pass ``num_sequences`` (e.g. the count of non-empty rows) to get verl's.
- seq_mean_token_sum_norm divides by N_seq * max_length like TRL's "dr_grpo"; verl divides by
  ``loss_scale_factor`` alone. ``max_length`` is required (a constant, so that the normaliser
  does not depend on the batch's padding).
- A zero denominator (no valid tokens, no rows, ``num_tokens=0``) gives 0, never nan, and a
  zero gradient. Entries of L on masked positions are ignored even when nan/inf.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .logprobs import masked_sum
from .registry import AGGREGATIONS

Count = float | int | Tensor | None


def _safe_div(num: Tensor, den: Tensor) -> Tensor:
    """num / den where den > 0, else 0 (no nan in the value nor in the gradient)."""
    ok = den > 0
    return torch.where(ok, num / torch.where(ok, den, torch.ones_like(den)), torch.zeros_like(num))


def _as_count(count: Count, default: Tensor) -> Tensor:
    """The given global count as a float32 tensor on ``default``'s device, or ``default``."""
    if count is None:
        return default
    return torch.as_tensor(count, dtype=torch.float32, device=default.device)


def _check(loss: Tensor, mask: Tensor) -> None:
    if loss.dim() != 2 or loss.shape != mask.shape:
        raise ValueError(f"loss and mask must both be [B, T]; got {tuple(loss.shape)} and {tuple(mask.shape)}")


@AGGREGATIONS.register("token_mean")
def token_mean(
    loss: Tensor, mask: Tensor, *, num_tokens: Count = None, num_sequences: Count = None, max_length: int | None = None
) -> Tensor:
    """sum_it(L * m) / N_tok, N_tok = ``num_tokens`` or sum(mask). Scalar float32.

    loss [B, T], mask [B, T]. ``num_sequences`` / ``max_length`` are accepted and unused, so
    every mode takes the same arguments. DAPO's token-level mean: every token of the global
    batch weighs the same, whatever its sequence's length.
    """
    _check(loss, mask)
    total = masked_sum(loss, mask)  # []
    return _safe_div(total, _as_count(num_tokens, mask.to(torch.float32).sum()))


@AGGREGATIONS.register("seq_mean_token_mean")
def seq_mean_token_mean(
    loss: Tensor, mask: Tensor, *, num_tokens: Count = None, num_sequences: Count = None, max_length: int | None = None
) -> Tensor:
    """sum_i [ sum_t(L * m)_i / |o_i| ] / N_seq, N_seq = ``num_sequences`` or B. Scalar float32.

    loss [B, T], mask [B, T]; |o_i| = sum_t m_it, and a row with |o_i| = 0 contributes 0.
    The original GRPO objective: each sequence weighs the same, its tokens share its weight.
    ``num_tokens`` / ``max_length`` are unused.
    """
    _check(loss, mask)
    row_sum = masked_sum(loss, mask, dim=-1)  # [B]
    row_len = mask.to(torch.float32).sum(dim=-1)  # [B] |o_i|
    per_seq = _safe_div(row_sum, row_len)  # [B]
    rows = torch.tensor(float(loss.shape[0]), device=loss.device)
    return _safe_div(per_seq.sum(), _as_count(num_sequences, rows))


@AGGREGATIONS.register("seq_mean_token_sum")
def seq_mean_token_sum(
    loss: Tensor, mask: Tensor, *, num_tokens: Count = None, num_sequences: Count = None, max_length: int | None = None
) -> Tensor:
    """sum_i sum_t(L * m)_i / N_seq, N_seq = ``num_sequences`` or B. Scalar float32.

    loss [B, T], mask [B, T]. Longer sequences weigh more (the per-sequence sum is not
    normalised by length). ``num_tokens`` / ``max_length`` are unused.
    """
    _check(loss, mask)
    rows = torch.tensor(float(loss.shape[0]), device=loss.device)
    return _safe_div(masked_sum(loss, mask), _as_count(num_sequences, rows))


@AGGREGATIONS.register("seq_mean_token_sum_norm")
def seq_mean_token_sum_norm(
    loss: Tensor, mask: Tensor, *, num_tokens: Count = None, num_sequences: Count = None, max_length: int | None = None
) -> Tensor:
    """sum_it(L * m) / (N_seq * max_length), N_seq = ``num_sequences`` or B. Scalar float32.

    loss [B, T], mask [B, T]. Dr.GRPO ("GRPO done right"): a constant normaliser, so neither
    the sequence length nor the number of valid tokens biases the gradient. ``max_length``
    (the maximum completion length, a constant of the run) is required; ``num_tokens`` unused.
    """
    _check(loss, mask)
    if max_length is None or max_length <= 0:
        raise ValueError(f"seq_mean_token_sum_norm needs max_length > 0 (the max completion length), got {max_length}")
    rows = torch.tensor(float(loss.shape[0]), device=loss.device)
    return _safe_div(masked_sum(loss, mask), _as_count(num_sequences, rows) * float(max_length))
