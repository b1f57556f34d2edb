"""The distiller's interface: it is built from a :class:`~lightning_grpo.training.distill.DistillContext` of
plain functions (no GRPOModule), and its source never reaches into a module or the rollout package."""

from __future__ import annotations

import ast
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import lightning_grpo.training.distill as distill
from lightning_grpo.core.batch import RolloutBatch, micro_step
from lightning_grpo.training.distill import DistillContext, Distiller, DistillSettings, reference_batch


def _context(teacher: nn.Module, teacher_logp: float, seen: list) -> DistillContext:
    def logprobs(model, batch):  # the teacher's no-grad log-probs: one constant
        seen.append((model, len(batch)))
        return torch.full(batch.completion_mask.shape, teacher_logp)  # [B, Lc]

    return DistillContext(
        policy=lambda: pytest.fail("a module teacher never needs the student"),
        logprobs=logprobs,
        global_sum=lambda t: t.float(),
        precision=nullcontext,
        tokenizer=lambda: None,
        device=lambda: torch.device("cpu"),
        step=lambda: 0,
        micro_step=lambda rows, i: micro_step(rows, i, 1, 1),
    )


def test_a_distiller_from_plain_functions_gives_the_reverse_kl_advantage_by_hand():
    teacher, seen = nn.Linear(1, 1), []
    distiller = Distiller(DistillSettings(teacher=teacher, coef=0.5), _context(teacher, teacher_logp=-1.0, seen=seen))
    distiller.build(None)
    batch = RolloutBatch(
        input_ids=torch.zeros(2, 4, dtype=torch.long),
        attention_mask=torch.ones(2, 4, dtype=torch.long),
        completion_mask=torch.tensor([[1.0, 1.0], [1.0, 0.0]]),
        advantages=torch.tensor([3.0, -3.0]),
        rollout_logp=torch.tensor([[-0.2, -3.0], [-1.5, 0.0]]),
        prompt_length=2,
        group_size=2,
        temperature=1.0,
    )
    prepared = distiller.prepare(batch, records=None)
    assert seen == [(teacher, 2)]
    # A_t = -coef (roll_t - teacher_t): -0.5 (-0.2 - -1.0) = -0.4; the reward advantage is dropped
    torch.testing.assert_close(prepared.advantages, torch.tensor([[-0.4, 1.0], [0.25, 0.0]]))
    torch.testing.assert_close(batch.advantages, torch.tensor([3.0, -3.0]))  # the batch handed in is left as it was
    assert batch.teacher_logp is None and prepared.teacher_logp is not None


def test_gkd_reference_rows_are_padded_as_a_rollout():
    from lightning_grpo.rollout.base import Rollout, rollout_to_tensors

    class DigitTokenizer:  # "12" -> [1, 2]
        eos_token_id, pad_token_id = 9, 0

        def __call__(self, text, add_special_tokens):
            return SimpleNamespace(input_ids=[int(c) for c in text])

    tokenizer = DigitTokenizer()
    records = [{"prompt_ids": [5, 6, 7], "answer": "12"}, {"prompt_ids": [4], "answer": "3"}]
    got = reference_batch(records, tokenizer, "answer", 0.7, "cpu")
    want = rollout_to_tensors(
        Rollout(
            prompt_ids=[r["prompt_ids"] for r in records],
            completion_ids=[[1, 2, 9], [3, 9]],
            logprobs=[[0.0] * 3, [0.0] * 2],
            finished=[True, True],
            group_size=1,
        ),
        0,
    )
    for name in ("input_ids", "attention_mask", "completion_mask"):
        torch.testing.assert_close(getattr(got, name), getattr(want, name))
    torch.testing.assert_close(got.rollout_logp, want.rollout_logprobs)
    assert (got.prompt_length, got.group_size, got.temperature) == (3, 1, 0.7)


def test_distill_imports_nothing_from_rollout_and_never_names_a_module():
    tree = ast.parse(Path(distill.__file__).read_text())
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m.split(".")[0] == "rollout" or "lightning_grpo.rollout" in m], imported
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)
    }
    assert "module" not in names
    assert "GRPOModule" not in {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
