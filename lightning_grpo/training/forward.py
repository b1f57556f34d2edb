"""The policy's completion log-probs through the forward layout a batch calls for.

One function for every forward of a step (policy, reference, old, teacher): the layout is padded,
packed (:mod:`.packing`) or with each group's prompt shared (:mod:`.prefix`), as ``packing`` and
``prefix_sharing`` say, and the LM head runs in chunks (``logprob_path="chunked_hidden"``) or
through the model's own forward (``"logits"``).
"""

from __future__ import annotations

from functools import partial

from torch import nn

from ..core import TokenLogProbs
from ..core.batch import RolloutBatch
from ..models.fsdp import run_as_forward
from .packing import PackingMode, packed_token_logprobs, padded_token_logprobs, sampled_positions
from .prefix import PrefixSharingMode, choose_layout

__all__ = ["layout_token_logprobs"]


def layout_token_logprobs(model: nn.Module, batch: RolloutBatch, *, logprob_path: str, packing: PackingMode,
                          prefix_sharing: PrefixSharingMode, chunk_size: int,
                          compute_entropy: bool = False, save_probs: bool = False) -> TokenLogProbs:  # fmt: skip
    """Log-probs (and entropy) [B, Lc] of the completion tokens at the sampling temperature, through
    the path named by ``logprob_path`` (models without a decoder / LM head use "logits"), with a
    shared prefix, packed or padded as ``prefix_sharing`` and ``packing`` say (``save_probs``: the chunked
    path keeps its softmax for backward, :func:`~lightning_grpo.core.logprobs.logprobs_from_hidden`). Every
    path gives 0 where no token was sampled (padding, environment tokens): the chunked path never runs the
    LM head there."""
    chunked = logprob_path == "chunked_hidden"
    chunked = chunked and hasattr(model, "get_decoder") and hasattr(model, "get_output_embeddings")
    plan = choose_layout(model, batch, packing, prefix_sharing)
    fn = padded_token_logprobs if plan is None else partial(packed_token_logprobs, plan=plan)
    kwargs = dict(chunked=chunked, compute_entropy=compute_entropy, chunk_size=chunk_size, save_probs=save_probs)
    if chunked:  # decoder and LM head called directly: run them as a root forward for FSDP2
        return run_as_forward(model, fn, model, batch, **kwargs)
    out = fn(model, batch, **kwargs)
    keep = sampled_positions(batch)  # [B, Lc]
    return TokenLogProbs(out.logp.where(keep, 0.0), out.entropy.where(keep, 0.0) if compute_entropy else None)
