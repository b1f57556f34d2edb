"""The policy's completion log-probs through the forward layout a batch calls for.

One function for every forward of a step (policy, reference, old, teacher): the layout is padded,
packed (:mod:`.packing`) or with each group's prompt shared (:mod:`.prefix`), as ``forward.packing`` and
``forward.prefix_sharing`` say, and the tokens are scored by the ``LOGPROBS`` entry ``forward.logprob_path``
names: ``chunked_hidden`` reads the decoder's hidden states and runs the LM head in chunks, ``logits`` reads
the model's own forward.
"""

from __future__ import annotations

from functools import partial

from torch import nn

from ..core import LOGPROBS, TokenLogProbs
from ..core.batch import RolloutBatch
from ..models.fsdp import run_as_forward
from .packing import packed_token_logprobs, padded_token_logprobs, sampled_positions
from .prefix import choose_layout
from .settings import ForwardSettings

__all__ = ["layout_token_logprobs"]


def layout_token_logprobs(
    model: nn.Module, batch: RolloutBatch, forward: ForwardSettings, compute_entropy: bool = False
) -> TokenLogProbs:
    """Log-probs (and entropy) [B, Lc] of the completion tokens at the sampling temperature, scored by
    ``LOGPROBS[forward.logprob_path]`` (models without a decoder / LM head are scored from their logits), with a
    shared prefix, packed or padded as ``forward.prefix_sharing`` and ``forward.packing`` say (``forward.save_probs``:
    the chunked path keeps its softmax for backward, :func:`~lightning_grpo.core.logprobs.logprobs_from_hidden`).
    Every path gives 0 where no token was sampled (padding, environment tokens): the chunked path never runs the
    LM head there."""
    score = LOGPROBS.variant(forward.logprob_path)
    # a transformers model's methods: without a decoder / LM head to call apart, score the model's own logits
    # a transformers model (third-party)
    if score.spec.reads == "hidden" and not (hasattr(model, "get_decoder") and hasattr(model, "get_output_embeddings")):
        score = LOGPROBS.variant("logits")
    plan = choose_layout(model, batch, forward.packing, forward.prefix_sharing)
    fn = padded_token_logprobs if plan is None else partial(packed_token_logprobs, plan=plan)
    kwargs = dict(
        score=score, compute_entropy=compute_entropy, chunk_size=forward.chunk_size, save_probs=forward.save_probs
    )
    if score.spec.reads == "hidden":  # decoder and LM head called directly: run them as a root forward for FSDP2
        return run_as_forward(model, fn, model, batch, **kwargs)
    out = fn(model, batch, **kwargs)
    keep = sampled_positions(batch)  # [B, Lc]
    return TokenLogProbs(out.logp.where(keep, 0.0), out.entropy.where(keep, 0.0) if compute_entropy else None)
