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

    def select(self, rows: Tensor) -> RolloutBatch:
        """The sub-batch of the given row indices (tensors indexed, scalars kept)."""
        changes = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Tensor):
                changes[f.name] = value[rows]
        return replace(self, **changes)

    def to(self, device: torch.device | str) -> RolloutBatch:
        changes = {
            f.name: getattr(self, f.name).to(device) for f in fields(self) if isinstance(getattr(self, f.name), Tensor)
        }
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


@dataclass(frozen=True)
class BatchGeometry:
    """How one generation batch becomes optimizer steps: the one place these numbers are derived.

    Its inputs have one home each: ``prompts`` is ``data.batch_size`` (per rank), ``group_size`` the
    completions per prompt that train (``rollout.sampling.n``, or ``rollout.selection.gfpo_keep``),
    ``num_iterations`` and ``steps_per_generation`` are ``model.algorithm``'s and ``accumulate`` is the
    Trainer's ``accumulate_grad_batches``. The run plan builds it once, with its limits checked
    (``lightning_grpo.plan.run_plan.RunPlan.geometry``); the rollout callback hands it to the data module and the module.

    Worked example: 8 prompts x 8 completions = 64 rows per generation; ``steps_per_generation=2``
    splits them into 2 mini-batches of 32 (one optimizer step each); ``accumulate=2`` splits each into 2
    micro-batches of 16 (one ``training_step`` each); ``num_iterations=2`` passes twice. One generation
    then feeds 2 x 2 = 4 optimizer steps and 4 x 2 = 8 training steps, and generation g starts at
    optimizer step 4 g.
    """

    prompts: int = 1
    group_size: int = 1
    num_iterations: int = 1
    steps_per_generation: int = 1
    accumulate: int = 1

    def __post_init__(self) -> None:
        for name in ("prompts", "group_size", "num_iterations", "steps_per_generation", "accumulate"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"BatchGeometry.{name} must be an integer >= 1, got {value!r}")

    @property
    def rows(self) -> int:
        """Completions that train per generation and rank (prompts x group_size)."""
        return self.prompts * self.group_size

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps one generation batch feeds (num_iterations x steps_per_generation)."""
        return self.num_iterations * self.steps_per_generation

    @property
    def training_steps(self) -> int:
        """``training_step`` calls one generation batch feeds (optimizer_steps x accumulate)."""
        return self.optimizer_steps * self.accumulate

    def generation(self, global_step: int) -> int:
        """The generation batch that optimizer step ``global_step`` trains on."""
        return global_step // self.optimizer_steps

    def micro_step(self, num_rows: int, step: int) -> MicroStep:
        """Rows of training step ``step`` (0-based within the generation) of a batch of ``num_rows``."""
        return micro_step(num_rows, step, self.steps_per_generation, self.accumulate)


def position_ids(attention_mask: Tensor) -> Tensor:
    """Positions that skip left padding, so a left-padded prompt sees the positions vLLM uses."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # [B, L]
