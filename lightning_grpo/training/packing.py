"""Padding-free micro-batches: several sequences packed into one row, no hand-written attention.

A rollout micro-batch is padded to its longest prompt and its longest completion, so with ragged
completion lengths most of a padded forward is spent on padding. :class:`PackPlan` places the
real tokens of each row (``attention_mask == 1``) back to back into ``R`` rows of width ``W``
(``W`` = the longest sequence, first-fit decreasing), with position ids that restart at 0 for
each sequence. Called with ``attention_mask=None`` and these position ids (and no KV cache),
transformers detects the packed format (``masking_utils.find_packed_sequence_indices``) and gives
each sequence a block-diagonal causal mask for its sdpa / eager / flash / flex attention: every
sequence sees exactly the context and positions it has in the padded layout, so the log-probs
and their gradients equal the padded ones (tests/training/test_packing.py).

The plan is generic over per-token tensors: :meth:`PackPlan.pack` moves any ``[B, L, *]`` tensor
(ids, positions, a per-token turn index, ...) into the packed layout and :meth:`PackPlan.unpack`
back; :meth:`PackPlan.completion_tokens` / :meth:`PackPlan.scatter_completion` go between the
``[B, Lc, *]`` completion layout of :class:`~lightning_grpo.core.batch.RolloutBatch` and the ``[Nc, *]``
real completion tokens. Log-probs come back in the padded ``[B, Lc]`` layout (0 on padding), so the
loss and everything after it is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from ..core import TokenLogProbs
from ..core.batch import RolloutBatch, position_ids
from ..core.registry import Variant

#: transformers attention backends that build their mask through ``create_causal_mask`` and so
#: honour packed position ids.
PACKED_ATTENTION = ("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")
#: ``packing="auto"`` packs when the packed rows hold at most this share of the padded tokens.
AUTO_MAX_SHARE = 0.75

PackingMode = Literal["auto", "on", "off"]


@dataclass
class PackPlan:
    """Where each real token of a padded ``[B, L]`` batch goes in the packed ``[R, W]`` layout."""

    index: Tensor  # [B, L] long: flat position (row * W + column) in the packed layout, -1 on padding
    valid: Tensor  # [B, L] bool: the real tokens (attention_mask == 1)
    prompt_length: int  # Lp: completions start at column Lp of the padded layout
    rows: int  # R
    width: int  # W
    owner: Tensor | None = None  # [B, L] bool: the tokens that fill their slot (None: every real token)

    @classmethod
    def from_mask(cls, attention_mask: Tensor, prompt_length: int) -> PackPlan:
        """First-fit decreasing of the rows' real tokens into rows of the longest row's length.

        Real tokens need not be contiguous: they keep their order (what ``position_ids`` counts)."""
        valid = attention_mask.bool()  # [B, L]
        lengths = valid.sum(1).tolist()
        width = max(max(lengths, default=0), 1)
        start, rows = first_fit_decreasing(lengths, width)  # flat start of each sequence
        offsets = torch.tensor(start, dtype=torch.long, device=valid.device)[:, None]  # [B, 1]
        index = torch.where(valid, offsets + valid.long().cumsum(1) - 1, -1)  # [B, L]
        return cls(index, valid, prompt_length, rows, width)

    @property
    def tokens(self) -> int:
        """Real tokens (what a packed forward processes, up to the last row's slack)."""
        return int(self.valid.sum())

    @property
    def share(self) -> float:
        """Packed slots / padded slots: the share of the padded forward's tokens a packed one runs."""
        return self.rows * self.width / max(self.valid.numel(), 1)

    def pack(self, x: Tensor, fill: float | int = 0) -> Tensor:
        """[B, L, *] -> [R, W, *]: real tokens in packed order, ``fill`` in the empty slots."""
        own = self.valid if self.owner is None else self.owner  # [B, L]
        flat = x.new_full((self.rows * self.width, *x.shape[2:]), fill)  # [R*W, *]
        flat = flat.index_copy(0, self.index[own], x[own])
        return flat.reshape(self.rows, self.width, *x.shape[2:])

    def unpack(self, y: Tensor, fill: float | int = 0) -> Tensor:
        """[R, W, *] -> [B, L, *]: back to the padded layout, ``fill`` on padding."""
        flat = y.reshape(self.rows * self.width, *y.shape[2:])  # [R*W, *]
        out = y.new_full((*self.valid.shape, *y.shape[2:]), fill)  # [B, L, *]
        return out.index_put((self.valid,), flat[self.index[self.valid]])

    def position_ids(self) -> Tensor:
        """[R, W] positions restarting at 0 per sequence (as :func:`~lightning_grpo.core.batch.position_ids`
        gives the padded rows); empty slots get 0, a one-token sequence of their own each."""
        return self.pack(position_ids(self.valid.long()))

    def completion_valid(self) -> Tensor:
        """[B, Lc] bool: real completion tokens."""
        return self.valid[:, self.prompt_length :]

    def completion_tokens(self, x: Tensor) -> Tensor:
        """[B, Lc, *] (completion layout) -> [Nc, *]: the real completion tokens, packed order."""
        return x[self.completion_valid()]

    def scatter_completion(self, values: Tensor, fill: float = 0.0) -> Tensor:
        """[Nc, *] -> [B, Lc, *]: values of the real completion tokens back in the completion layout."""
        valid = self.completion_valid()
        out = values.new_full((*valid.shape, *values.shape[1:]), fill)
        return out.index_put((valid,), values)

    def predictor_index(self) -> Tensor:
        """[Nc] flat packed positions whose outputs predict the real completion tokens: the slot of the
        previous real token of the same sequence (a sequence starts with at least one prompt token)."""
        col = torch.arange(self.valid.shape[1], device=self.valid.device).expand_as(self.valid)  # [B, L]
        last = torch.where(self.valid, col, -1).cummax(1).values  # [B, L] last real column <= t
        previous = torch.cat([last.new_full((len(last), 1), -1), last[:, :-1]], 1)  # [B, L] last real column < t
        slot = self.index.gather(1, previous.clamp(min=0))  # [B, L]
        return self.completion_tokens(slot[:, self.prompt_length :])

    def attention_mask(self, model: nn.Module) -> Tensor | None:
        """The attention mask of the packed forward: None, transformers derives each sequence's
        block-diagonal causal mask from the restarting position ids."""
        return None


def first_fit_decreasing(lengths: list[int], width: int) -> tuple[list[int], int]:
    """Flat start (row * width + column) of each length in rows of ``width``, longest first, each in
    the first row with room; and the number of rows (at least 1)."""
    bins: list[int] = []  # used length of each packed row
    start = [0] * len(lengths)
    for b in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        row = next((r for r, used in enumerate(bins) if used + lengths[b] <= width), None)
        if row is None:
            row = len(bins)
            bins.append(0)
        start[b] = row * width + bins[row]
        bins[row] += lengths[b]
    return start, max(len(bins), 1)


def supports_packing(model: nn.Module) -> bool:
    """An HF model whose attention backend honours packed position ids."""
    config = getattr(model, "config", None)  # a transformers model or config (third-party)
    return getattr(config, "_attn_implementation", None) in PACKED_ATTENTION and hasattr(model, "get_decoder")


def choose_plan(model: nn.Module, batch: RolloutBatch, mode: PackingMode) -> PackPlan | None:
    """The packing plan for ``batch`` under ``mode``, or None for the padded forward.

    "auto" packs an HF model with a packing-aware attention backend when the packed rows hold at
    most ``AUTO_MAX_SHARE`` of the padded tokens; "on" always packs (and fails on a model that
    cannot); "off" never does."""
    if mode == "off":
        return None
    if not supports_packing(model):
        if mode == "on":
            # a transformers model or config (third-party)
            attn = getattr(getattr(model, "config", None), "_attn_implementation", None)
            raise ValueError(
                f"GRPOModule packing='on' needs a Hugging Face causal LM whose attention is one of {PACKED_ATTENTION}; "
                f"got {type(model).__name__} with attention {attn!r} (use packing='auto' or 'off')"
            )
        return None
    plan = PackPlan.from_mask(batch.attention_mask, batch.prompt_length)
    return plan if mode == "on" or plan.share <= AUTO_MAX_SHARE else None


def sampled_positions(batch: RolloutBatch) -> Tensor:
    """[B, Lc] bool: the completion positions that hold a sampled token, i.e. not padding and, in multi-turn
    episodes, not an environment token (``turn_ids`` -1). The LM head runs on these only: every loss, guard and
    metric reads sampled tokens, and a tool response can be most of an episode."""
    keep = batch.attention_mask[:, batch.prompt_length :] > 0  # [B, Lc]
    return keep & (batch.turn_ids >= 0) if batch.turn_ids is not None else keep


def _scatter(keep: Tensor, values: Tensor) -> Tensor:
    """``values`` [N] of the True positions of ``keep`` back in ``keep``'s shape, 0 elsewhere (differentiable)."""
    return values.new_zeros(keep.shape).index_put((keep,), values)


def padded_token_logprobs(
    model: nn.Module,
    batch: RolloutBatch,
    *,
    score: Variant,
    compute_entropy: bool,
    chunk_size: int,
    save_probs: bool = False,
) -> TokenLogProbs:
    """Completion log-probs (and entropy) of ``batch`` from the padded ``[B, L]`` forward, ``[B, Lc]``, scored by
    ``score`` (a ``LOGPROBS`` variant). One that reads hidden states (``chunked_hidden``): decoder, then the LM head in
    chunks (the [B, Lc, V] logits never exist); one that reads logits: the model's own forward, HF models asked for
    the completion logits only (``logits_to_keep``)."""
    ids, lp = batch.input_ids, batch.prompt_length  # [B, L]
    pos = position_ids(batch.attention_mask)  # [B, L]
    if score.spec.reads == "hidden":
        out = model.get_decoder()(input_ids=ids, attention_mask=batch.attention_mask, position_ids=pos, use_cache=False)
        head = model.get_output_embeddings()
        keep = sampled_positions(batch)  # [B, Lc] the head skips padding and environment tokens
        res = score.fn(
            out.last_hidden_state[:, lp - 1 : -1][keep],  # [N, H] states that predict the sampled tokens
            head.weight,
            ids[:, lp:][keep],
            bias=head.bias,
            temperature=batch.temperature,
            compute_entropy=compute_entropy,
            chunk_size=chunk_size,
            save_probs=save_probs,
        )
        return TokenLogProbs(_scatter(keep, res.logp), _scatter(keep, res.entropy) if compute_entropy else None)
    logits = padded_completion_logits(model, batch)  # [B, Lc, V]
    return score.fn(logits, ids[:, lp:], temperature=batch.temperature, compute_entropy=compute_entropy)


def padded_completion_logits(model: nn.Module, batch: RolloutBatch) -> Tensor:
    """[B, Lc, V] logits that predict the completion tokens, from the model's own padded forward (HF
    models are asked for the completion logits only, ``logits_to_keep``). Also GKD's full distributions."""
    ids, lp = batch.input_ids, batch.prompt_length  # [B, L]
    keep = ids.shape[1] - lp + 1
    # a transformers model or config (third-party)
    kwargs = {"logits_to_keep": keep} if hasattr(model, "get_output_embeddings") else {}
    logits = model(
        input_ids=ids, attention_mask=batch.attention_mask, position_ids=position_ids(batch.attention_mask), **kwargs
    ).logits
    return logits[:, -keep:-1]  # [B, Lc, V]


def packed_token_logprobs(
    model: nn.Module,
    batch: RolloutBatch,
    *,
    plan: PackPlan,
    score: Variant,
    compute_entropy: bool,
    chunk_size: int,
    save_probs: bool = False,
) -> TokenLogProbs:
    """Completion log-probs (and entropy) of ``batch`` from one packed forward, in the padded
    ``[B, Lc]`` layout (0 on padding), scored by ``score`` (a ``LOGPROBS`` variant). Reading hidden states: decoder,
    then the LM head in chunks on the real completion tokens only; reading logits: the model's own forward (what
    FSDP2 / ZeRO-3 gather in)."""
    ids = plan.pack(batch.input_ids)  # [R, W]
    kwargs = dict(
        input_ids=ids, attention_mask=plan.attention_mask(model), position_ids=plan.position_ids(), use_cache=False
    )
    pred = plan.predictor_index()  # [Nc]
    targets = plan.completion_tokens(batch.completion_ids)  # [Nc]
    if score.spec.reads == "hidden":
        hidden = model.get_decoder()(**kwargs).last_hidden_state  # [R, W, H]
        head = model.get_output_embeddings()
        keep = plan.completion_tokens(sampled_positions(batch))  # [Nc] the head skips environment tokens
        res = score.fn(
            hidden.reshape(-1, hidden.shape[-1])[pred[keep]],  # [N, H]
            head.weight,
            targets[keep],
            bias=head.bias,
            temperature=batch.temperature,
            compute_entropy=compute_entropy,
            chunk_size=chunk_size,
            save_probs=save_probs,
        )
        out = TokenLogProbs(_scatter(keep, res.logp), _scatter(keep, res.entropy) if compute_entropy else None)  # [Nc]
    else:
        logits = model(**kwargs).logits  # [R, W, V]
        logits = logits.reshape(-1, logits.shape[-1])[pred]  # [Nc, V]
        out = score.fn(logits, targets, temperature=batch.temperature, compute_entropy=compute_entropy)
    entropy = plan.scatter_completion(out.entropy) if compute_entropy else None
    return TokenLogProbs(plan.scatter_completion(out.logp), entropy)  # [B, Lc] each
