"""Helpers shared by the rollout-engine tests (tests/rollout) and the export and QLoRA tests: log-probs recomputed by a model."""

from __future__ import annotations

import torch

from lightning_grpo.rollout.base import Rollout, rollout_to_tensors


def recompute_logprobs(model: torch.nn.Module, rollout: Rollout, temperature: float, pad_id: int = 0):
    """Teacher-forced ``log_softmax(logits / T)`` of the rollout's sampled tokens under ``model``.

    Returns ``(recomputed [B, Lc], engine [B, Lc], completion_mask [B, Lc])`` (float32, padding zeroed).
    """
    t = rollout_to_tensors(rollout, pad_id)
    position_ids = (t.attention_mask.cumsum(-1) - 1).clamp(min=0)  # [B, Lp+Lc], left padding skipped
    Lc = t.completion_mask.shape[1]
    with torch.no_grad():
        logits = model(input_ids=t.input_ids, attention_mask=t.attention_mask, position_ids=position_ids).logits
    logits = logits[:, -Lc - 1 : -1].float() / temperature  # [B, Lc, V], column j predicts completion token j
    logp = torch.log_softmax(logits, dim=-1).gather(-1, t.input_ids[:, -Lc:, None]).squeeze(-1)  # [B, Lc]
    return logp * t.completion_mask, t.rollout_logprobs * t.completion_mask, t.completion_mask


def max_logprob_gap(model: torch.nn.Module, rollout: Rollout, temperature: float) -> float:
    """Largest |recomputed - engine| log-prob over the rollout's sampled tokens."""
    recomputed, engine, _ = recompute_logprobs(model, rollout, temperature)
    return float((recomputed - engine).abs().max())


def assert_eos_handling(rollout: Rollout, eos: int, max_new_tokens: int) -> None:
    """Finished rows end with exactly one EOS; unfinished rows are max_new_tokens long without
    EOS; log-probs align with tokens; both kinds occur."""
    for ids, lps, done in zip(rollout.completion_ids, rollout.logprobs, rollout.finished):
        assert len(lps) == len(ids)
        if done:
            assert ids[-1] == eos and eos not in ids[:-1]
        else:
            assert len(ids) == max_new_tokens and eos not in ids
    assert 0 < sum(rollout.finished) < len(rollout.finished)
