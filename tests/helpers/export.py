"""Shared checks of exported model folders (tests/models/test_export.py, tests/models/test_export_qlora.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from lightning_grpo.cli import report

SEQUENCE = "4821=5"


@torch.no_grad()
def sequence_logprobs(model, tokenizer) -> torch.Tensor:
    """[T-1] log-probs of each next token of SEQUENCE (teacher forcing)."""
    ids = torch.tensor([tokenizer(SEQUENCE, add_special_tokens=False)["input_ids"]])
    logits = model.eval()(input_ids=ids).logits.float()  # [1, T, V]
    return torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None]).squeeze(-1)


def greedy_accuracy(engine, built) -> float:
    from lightning_grpo import RolloutCallback
    from lightning_grpo.callbacks.evaluation import evaluate_prompts

    (callback,) = [c for c in built.trainer.callbacks if isinstance(c, RolloutCallback)]
    dm = built.datamodule
    return evaluate_prompts(engine, callback.reward_set, dm.tokenizer, dm.val_records, callback.sampling, 0, 0)[
        "val/greedy_accuracy"
    ]


def last_greedy_accuracy(run_dir: Path) -> float:
    return report.load_run(run_dir).series["val/greedy_accuracy"][-1][1]


def vllm_reads(folder: Path) -> None:
    """vLLM's own reading of the folder (config, tokenizer, generation config), without an engine:
    a dense float32 Qwen2 (no quantisation method: a 4-bit layout would make vLLM load bitsandbytes)."""
    from vllm.engine.arg_utils import EngineArgs

    config = EngineArgs(model=str(folder), dtype="float32", max_model_len=64).create_model_config()
    assert config.hf_config.architectures == ["Qwen2ForCausalLM"] and config.dtype == torch.float32
    assert config.quantization is None, config.quantization


def vllm_serves_the_policy(engine, folder: Path | None, built, run_dir: Path, min_accuracy: float) -> float:
    """The engine with the folder's weights (``folder`` None: the caller loaded them, or an adapter):
    the run's last held-out greedy accuracy exactly (a trained policy, at least ``min_accuracy``: far
    from chance, so a folder vLLM misreads shows), and the engine's log-probs of sampled completions
    are the trained policy's (1e-4; a stale or unmerged weight gives far more). Returns the accuracy."""
    from safetensors.torch import load_file

    from lightning_grpo.rollout.base import SamplingConfig
    from tests.helpers.rollout import max_logprob_gap

    if folder is not None:
        engine.load_weights(list(load_file(folder / "model.safetensors").items()))
    accuracy = greedy_accuracy(engine, built)
    assert accuracy == last_greedy_accuracy(run_dir) and accuracy >= min_accuracy, (
        accuracy,
        last_greedy_accuracy(run_dir),
    )
    prompts = [r["prompt_ids"] for r in built.datamodule.val_records[:16]]
    sampled = engine.generate(prompts, SamplingConfig(n=4, temperature=1.0, max_new_tokens=2), seed=0)
    gap = max_logprob_gap(built.model.policy.eval(), sampled, 1.0)
    assert gap <= 1e-4, f"vLLM's log-probs of the exported folder differ from the trained policy's by {gap:.2e}"
    return accuracy
