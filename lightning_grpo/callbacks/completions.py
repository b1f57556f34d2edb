"""What the model wrote: sampled completions with their rewards, logged every N optimizer steps.

For a logged step, the first ``groups`` groups of the training batch (every completion of each):
the prompt, the completion, each reward function's value and the weighted total, the advantage,
the length in sampled tokens and whether it was truncated; multi-turn episodes (agents) also get
the transcript after the prompt with the chat markers, tool calls and tool results, and the
number of turns. Rows go to ``completions.jsonl`` in the logger's run directory (rank 0, one JSON
object per row) and to the logger's own table, chosen by its class (subclasses too, `TABLE_WRITERS`):
W&B (``log_table``), TensorBoard (a markdown table with ``add_text``) or MLflow (``log_table``). A
firing guard logs the completions of its step too (`CompletionLog.log_for_alarm`), and its
``alarms.jsonl`` record points to them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from lightning.pytorch.loggers import MLFlowLogger, TensorBoardLogger, WandbLogger

from .distributed import local_log_dir

FILE = "completions.jsonl"
COLUMNS = ("step", "group", "prompt", "completion", "rewards", "reward", "advantage", "length", "truncated")


@dataclass
class CompletionLogSettings:
    """When and how much of what the model wrote is logged (``rollout.log_completions``)."""

    every_n_steps: int = 50
    """Log the completions of every this many optimizer steps (0 = only at steps where a guard fires)."""
    groups: int | None = 2
    """Groups (a prompt with all its completions) logged per step; null = the whole batch."""

    def __post_init__(self) -> None:
        if not isinstance(self.every_n_steps, int) or self.every_n_steps < 0:
            raise ValueError(
                f"rollout.log_completions.every_n_steps must be an integer >= 0, got {self.every_n_steps!r}"
            )
        if self.groups is not None and (not isinstance(self.groups, int) or self.groups < 1):
            raise ValueError(
                f"rollout.log_completions.groups must be an integer >= 1 or null (all), got {self.groups!r}"
            )


class CompletionLog:
    """Turns a generation batch into rows and writes them (see the module docstring)."""

    def __init__(self, settings: CompletionLogSettings) -> None:
        self.settings = settings
        self._batch: tuple[Any, list[str]] | None = None  # (SampleResult, reward names) of the current generation
        self._logged_at: int | None = None  # the step the current generation's rows were logged at

    def new_batch(self, trainer: Any, module: Any, result: Any, reward_names: list[str]) -> None:
        """A fresh generation batch: remember it, and log it when the step is due."""
        self._batch, self._logged_at = (result, list(reward_names)), None
        every = self.settings.every_n_steps
        if every and trainer.global_step % every == 0:
            self.log(trainer, module)

    def log_for_alarm(self, trainer: Any, module: Any) -> str | None:
        """Log the current batch (once) for a guard that fired; returns where its rows are."""
        if self._batch is None:
            return None
        self.log(trainer, module)
        return f"{FILE} step {self._logged_at}" if self._logged_at is not None else None

    def log(self, trainer: Any, module: Any) -> None:
        if self._batch is None or self._logged_at is not None:
            return
        step = trainer.global_step
        rows = completion_rows(
            self._batch[0],
            self._batch[1],
            module.rollout_batch,
            trainer.datamodule.tokenizer,
            step,
            self.settings.groups,
        )
        self._logged_at = step
        # rank 0 writes; trainer.log_dir would broadcast, which the other ranks never join here
        log_dir = local_log_dir(trainer) if trainer.global_rank == 0 and trainer.loggers else None
        if log_dir is None:
            return
        os.makedirs(log_dir, exist_ok=True)
        with open(os.path.join(log_dir, FILE), "a", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        for logger in trainer.loggers:
            log_table(logger, rows, step)


def completion_rows(
    result: Any, reward_names: list[str], batch: Any, tokenizer: Any, step: int, groups: int | None
) -> list[dict[str, Any]]:
    """The rows of the first ``groups`` groups of a training batch (``result``: its SampleResult,
    ``batch``: the prepared RolloutBatch with its advantages)."""
    tensors, G = result.tensors, result.group_size
    rows_total = tensors.input_ids.shape[0]
    count = rows_total if groups is None else min(rows_total, groups * G)
    Lp = tensors.input_ids.shape[1] - tensors.completion_mask.shape[1]
    total = result.rewards @ result.weights  # [B]
    advantages = batch.advantages.detach().float().cpu() if batch is not None else torch.zeros(rows_total)
    if advantages.dim() == 2:  # token-level advantages: the mean over the completion's tokens
        mask = tensors.completion_mask.float()
        advantages = (advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    out = []
    for b in range(count):
        ids, attn = tensors.input_ids[b], tensors.attention_mask[b]
        prompt_ids = ids[:Lp][attn[:Lp].bool()].tolist()
        completion_ids = ids[Lp:][attn[Lp:].bool()].tolist()
        row = {
            "step": step,
            "group": b // G,
            "prompt": tokenizer.decode(prompt_ids, skip_special_tokens=False),
            "completion": tokenizer.decode(completion_ids, skip_special_tokens=True),
            "rewards": {name: float(v) for name, v in zip(reward_names, result.rewards[b].tolist())},
            "reward": float(total[b]),
            "advantage": float(advantages[b]),
            "length": int(tensors.completion_mask[b].sum()),
            "truncated": not bool(result.finished[b]),
        }
        if tensors.turn_ids is not None:  # an episode: the whole transcript after the prompt, tool calls included
            turns = tensors.turn_ids[b]
            row["transcript"] = tokenizer.decode(completion_ids, skip_special_tokens=False)
            row["turns"] = int(turns.max()) + 1 if bool((turns >= 0).any()) else 0
        out.append(row)
    return out


def log_table(logger: Any, rows: list[dict[str, Any]], step: int) -> None:
    """The rows in ``logger``'s own table format, chosen by its type (`TABLE_WRITERS`, subclasses
    included); other loggers (CSV: the jsonl file is its table): nothing."""
    writer = next((write for cls, write in TABLE_WRITERS if isinstance(logger, cls)), None)
    if writer is None:
        return
    columns = [*COLUMNS, *(["transcript"] if rows and "transcript" in rows[0] else [])]
    data = [[json.dumps(r[c]) if isinstance(r[c], dict) else r[c] for c in columns] for r in rows]
    writer(logger, columns, data, step)


def _wandb_table(logger: WandbLogger, columns: list[str], data: list[list], step: int) -> None:
    logger.log_table(key="completions", columns=columns, data=data, step=step)


def _tensorboard_table(logger: TensorBoardLogger, columns: list[str], data: list[list], step: int) -> None:
    header = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
    body = "".join("| " + " | ".join(_cell(v) for v in values) + " |\n" for values in data)
    logger.experiment.add_text("completions", header + body, global_step=step)


def _mlflow_table(logger: MLFlowLogger, columns: list[str], data: list[list], step: int) -> None:
    table = {c: [values[i] for values in data] for i, c in enumerate(columns)}
    logger.experiment.log_table(logger.run_id, data=table, artifact_file=f"completions/step_{step:07d}.json")


TABLE_WRITERS: tuple[tuple[type, Callable[[Any, list[str], list[list], int], None]], ...] = (
    (WandbLogger, _wandb_table),
    (TensorBoardLogger, _tensorboard_table),
    (MLFlowLogger, _mlflow_table),
)
"""(logger class, writer) in order: the first class the logger is an instance of writes its table."""


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", "<br>")
