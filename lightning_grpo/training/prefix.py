"""Shared-prefix forwards: each group's prompt computed once, its keys / values shared by the group.

In GRPO every prompt is sampled G times, so a padded or packed forward runs each prompt G times.
:class:`SharedPrefixPlan` lays a micro-batch out as one segment per prompt,

    [prompt_k ; completion_k,1 ; completion_k,2 ; ... ; completion_k,G]

(real tokens only), with a 4D attention mask in which a prompt token sees the prompt's earlier
tokens and a completion token sees the whole prompt and its own earlier tokens, never another
completion. Position ids are those of the padded layout (each completion continues from its
prompt's length). Every completion token therefore attends to exactly the keys and values it sees
in the padded forward, and the log-probs, entropies and gradients are the per-sample ones (the
prompt's gradient is the sum of what its G completions send back through its keys / values;
tests/training/test_prefix.py). Segments are packed into rows first-fit decreasing (``packing`` not "off")
or one per row.

Rows share a segment when their prompt tokens are equal (real ids at the same padded columns), so
nothing depends on how the rows were split into micro-batches: a group split in two shares within
each part, a multi-turn episode shares its opening prompt (its completion holds the model's turns
and the environment's replies). The mask is a dense ``[R, 1, W, W]`` tensor, honoured by the
``sdpa`` and ``eager`` attention of transformers' decoders without sliding-window layers.

``prefix_sharing="auto"`` picks the layout with :func:`forward_cost`, an estimate of the decoder's
multiply-adds (projections and MLP per token slot, attention per slot pair of a row): sharing is used
when it costs at most ``AUTO_MAX_SHARE`` of the padded or packed layout that would run otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from ..core.batch import RolloutBatch
from .packing import AUTO_MAX_SHARE, PackingMode, PackPlan, choose_plan, first_fit_decreasing

#: transformers attention backends that take a custom 4D mask as it is (bool for sdpa, additive for eager).
SHARED_ATTENTION = ("sdpa", "eager")

PrefixSharingMode = Literal["auto", "on", "off"]


@dataclass
class SharedPrefixPlan(PackPlan):
    """A :class:`PackPlan` whose rows of one prompt share that prompt's slots (``index`` maps their
    prompt tokens to the same slots; ``owner`` marks the first row's as the ones that fill them)."""

    segment: Tensor | None = None  # [R, W] long: the segment (prompt) of each slot; empty slots one of their own each
    member: Tensor | None = None  # [R, W] long: the batch row of a completion slot, -1 for prompt and empty slots

    @classmethod
    def from_batch(cls, batch: RolloutBatch, pack: bool = True) -> SharedPrefixPlan:
        """The shared-prefix layout of ``batch``: rows with equal prompts form one segment; segments
        packed first-fit decreasing into rows of the longest segment's length (``pack``) or one per row."""
        valid, lp = batch.attention_mask.bool(), batch.prompt_length  # [B, L]
        key = torch.where(valid[:, :lp], batch.input_ids[:, :lp], -1)  # [B, Lp] the prompt, pads marked
        _, group = torch.unique(key, dim=0, return_inverse=True)  # [B] segment of each row
        group, prompt_len, comp_len = group.cpu(), valid[:, :lp].sum(1).cpu(), valid[:, lp:].sum(1).cpu()  # [B] each
        groups = int(group.max()) + 1 if len(group) else 0
        rows_b = torch.arange(len(group))
        first = torch.full((groups,), len(group)).scatter_reduce_(
            0, group, rows_b, "amin"
        )  # [groups] first row of each
        seg_len = prompt_len[first] + torch.zeros(groups, dtype=torch.long).index_add_(0, group, comp_len)  # [groups]
        width = max(int(seg_len.max()) if groups else 1, 1)
        if pack:
            starts, rows = first_fit_decreasing(seg_len.tolist(), width)
        else:
            starts, rows = [k * width for k in range(groups)], max(groups, 1)
        # completion of row b starts after its prompt and the completions of the earlier rows of its segment
        before = torch.zeros(len(group), dtype=torch.long)  # [B]
        used = prompt_len[first].clone()  # [groups] running end of each segment
        for b, k in enumerate(group.tolist()):
            before[b] = used[k]
            used[k] += comp_len[b]
        start = torch.tensor(starts, dtype=torch.long)[group].to(valid.device)[:, None]  # [B, 1]
        before = before.to(valid.device)[:, None]  # [B, 1]
        in_prompt = torch.zeros_like(valid)
        in_prompt[:, :lp] = True  # [B, L]
        index = torch.where(
            in_prompt, start + valid.long().cumsum(1) - 1, start + before + (valid & ~in_prompt).long().cumsum(1) - 1
        )
        index = torch.where(valid, index, -1)  # [B, L]
        leader = torch.zeros(len(group), dtype=torch.bool, device=valid.device)
        leader[first.to(valid.device)] = True  # [B] the row whose prompt fills the segment's prompt slots
        owner = valid & (~in_prompt | leader[:, None])  # [B, L]
        plan = cls(index, valid, lp, rows, width, owner)
        plan.segment = plan._slot_segments(group.to(valid.device))
        rows_of = torch.arange(len(group), device=valid.device)[:, None].expand_as(valid)  # [B, L]
        plan.member = plan.pack(torch.where(in_prompt, -1, rows_of), fill=-1)  # [R, W]
        return plan

    def _slot_segments(self, group: Tensor) -> Tensor:
        """[R, W] segment of each slot; each empty slot its own (it then attends to itself only)."""
        seg = self.pack(group[:, None].expand_as(self.valid), fill=-1)  # [R, W]
        lone = group.numel() + torch.arange(seg.numel(), device=seg.device).reshape(seg.shape)  # [R, W]
        return torch.where(seg < 0, lone, seg)

    @property
    def shared_tokens(self) -> int:
        """Prompt tokens computed once instead of once per row (what sharing saves over packing)."""
        return self.tokens - int(self.owner.sum())

    def attention_mask(self, model: nn.Module) -> Tensor:
        """[R, 1, W, W]: slot i attends to slot j <= i of its segment that is a prompt slot or of its
        own completion. Bool (True = attend) for sdpa, additive (0 / dtype min) for eager."""
        seg, member = self.segment, self.member  # [R, W]
        width = seg.shape[1]
        causal = torch.ones(width, width, dtype=torch.bool, device=seg.device).tril()  # [W, W]
        visible = (member[:, None, :] < 0) | (member[:, :, None] == member[:, None, :])  # [R, W, W]
        allowed = (seg[:, :, None] == seg[:, None, :]) & visible & causal  # [R, W, W]
        allowed = allowed[:, None]  # [R, 1, W, W]
        if attention_backend(model) == "eager":
            dtype = getattr(model, "dtype", torch.float32)  # a transformers model or config (third-party)
            return torch.zeros(allowed.shape, dtype=dtype, device=seg.device).masked_fill_(
                ~allowed, torch.finfo(dtype).min
            )
        return allowed


def attention_backend(model: nn.Module) -> str | None:
    # a transformers model or config (third-party)
    return getattr(getattr(model, "config", None), "_attn_implementation", None)


def supports_prefix_sharing(model: nn.Module) -> bool:
    """An HF decoder with sdpa / eager attention and no sliding-window layer (a custom 4D mask
    replaces the model's own, window included)."""
    config = getattr(model, "config", None)  # a transformers model or config (third-party)
    if attention_backend(model) not in SHARED_ATTENTION or not hasattr(model, "get_decoder"):
        return False
    layer_types = getattr(config, "layer_types", None)  # a transformers model or config (third-party)
    if layer_types is not None:
        return all(t == "full_attention" for t in layer_types)
    # a transformers model or config (third-party)
    return getattr(config, "sliding_window", None) is None or getattr(config, "use_sliding_window", True) is False


def forward_cost(model: nn.Module, rows: int, width: int) -> float:
    """Multiply-adds of a decoder forward over ``rows`` x ``width`` slots with a dense attention mask,
    per layer: projections and MLP per slot (4 h^2 + 3 h f), scores and weighted values per slot pair
    of a row (2 h). A model without these config fields counts slots only."""
    config = getattr(model, "config", None)  # a transformers model or config (third-party)
    h, f = getattr(config, "hidden_size", 0), getattr(config, "intermediate_size", 0)
    if not h:
        return float(rows * width)
    return float(rows * width * (4 * h * h + 3 * h * f + 2 * h * width))


def choose_layout(
    model: nn.Module, batch: RolloutBatch, packing: PackingMode, sharing: PrefixSharingMode
) -> PackPlan | None:
    """The layout of ``batch``'s forward: a :class:`SharedPrefixPlan`, a :class:`PackPlan` or None
    (padded), as ``packing`` and ``sharing`` say.

    "on" shares (and fails on a model that cannot), "off" never does; "auto" shares when the model
    can and :func:`forward_cost` of the shared layout is at most ``AUTO_MAX_SHARE`` of the layout
    ``packing`` picks without sharing."""
    base = choose_plan(model, batch, packing)
    if sharing == "off":
        return base
    if not supports_prefix_sharing(model):
        if sharing == "on":
            raise ValueError(
                f"GRPOModule prefix_sharing='on' needs a Hugging Face causal LM with {' or '.join(SHARED_ATTENTION)} attention "
                f"and no sliding-window layers; got {type(model).__name__} with attention {attention_backend(model)!r} "
                "(use prefix_sharing='auto' or 'off')"
            )
        return base
    shared = SharedPrefixPlan.from_batch(batch, pack=packing != "off")
    if sharing == "on":
        return shared
    rows, width = (base.rows, base.width) if base is not None else batch.input_ids.shape
    cheaper = forward_cost(model, shared.rows, shared.width) <= AUTO_MAX_SHARE * forward_cost(model, rows, width)
    return shared if cheaper else base
