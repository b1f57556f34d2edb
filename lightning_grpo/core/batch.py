"""The tensors of one generation batch, and how a training step slices them.

A generation batch holds B = P * G completions. With ``num_iterations`` passes over it, each
split into ``steps_per_generation`` mini-batches (one optimizer step each), each split into
``accumulate`` micro-batches (one ``training_step`` each, Lightning's
``accumulate_grad_batches``), a generation feeds R = num_iterations * steps_per_generation *
accumulate consecutive training steps; micro step m takes rows

    mini  = rows split into steps_per_generation chunks, chunk (m // accumulate) % steps_per_generation
    micro = mini split into accumulate chunks, chunk m % accumulate

and normalises its loss by the token / sequence counts of the whole mini-batch, so that the
accumulated gradient equals the gradient of one batch ``accumulate`` times larger.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import NamedTuple

import torch
from torch import Tensor


@dataclass
class RolloutBatch:
    """Everything a training step needs from one generation batch (rows group-contiguous)."""

    input_ids: Tensor  # [B, Lp + Lc] prompt (left-padded) + completion (right-padded)
    attention_mask: Tensor  # [B, Lp + Lc]
    completion_mask: Tensor  # [B, Lc] float, 1 on completion tokens that enter the loss
    advantages: Tensor  # [B], or [B, Lc] token-level (on-policy distillation)
    rollout_logp: Tensor  # [B, Lc] the engine's post-temperature log-probs of the sampled tokens
    prompt_length: int  # Lp
    group_size: int  # G (completions per prompt after selection)
    temperature: float  # sampling temperature: log-probs are computed at the same temperature
    old_logp: Tensor | None = None  # [B, Lc] when the batch is reused after an optimizer step
    ref_logp: Tensor | None = None  # [B, Lc] when beta > 0
    turn_ids: Tensor | None = None  # [B, Lc] long: model turn of each sampled token, -1 elsewhere (multi-turn)
    teacher_logp: Tensor | None = None  # [B, Lc] the distillation teacher's log-probs of the sampled tokens
    keep_mask: Tensor | None = None  # [B, Lc] float: tokens the loss's rejection criteria keep (global normaliser)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def completion_ids(self) -> Tensor:  # [B, Lc]
        return self.input_ids[:, self.prompt_length :]

    def select(self, rows: Tensor) -> "RolloutBatch":
        """The sub-batch of the given row indices (tensors indexed, scalars kept)."""
        changes = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Tensor):
                changes[f.name] = value[rows]
        return replace(self, **changes)

    def to(self, device: torch.device | str) -> "RolloutBatch":
        changes = {f.name: getattr(self, f.name).to(device) for f in fields(self) if isinstance(getattr(self, f.name), Tensor)}
        return replace(self, **changes)


class MicroStep(NamedTuple):
    iteration: int  # which pass over the generation batch
    mini: Tensor  # [b_mini] row indices of the optimizer step's mini-batch
    micro: Tensor  # [b_micro] row indices of this training step


def micro_step(num_rows: int, step: int, steps_per_generation: int, accumulate: int) -> MicroStep:
    """Rows of micro step ``step`` (0-based within the generation); see the module docstring."""
    rows = torch.arange(num_rows)
    mini_index = (step // accumulate) % steps_per_generation
    mini = torch.tensor_split(rows, steps_per_generation)[mini_index]
    micro = torch.tensor_split(mini, accumulate)[step % accumulate]
    return MicroStep(step // (accumulate * steps_per_generation), mini, micro)


def steps_per_batch(num_iterations: int, steps_per_generation: int, accumulate: int) -> int:
    """Training steps (``training_step`` calls) fed by one generation batch."""
    return num_iterations * steps_per_generation * accumulate


def position_ids(attention_mask: Tensor) -> Tensor:
    """Positions that skip left padding, so a left-padded prompt sees the positions vLLM uses."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # [B, L]
