"""benchmarks/gpu_check.py in its reduced form on CPU: the tiny model, full / LoRA / QLoRA training
rows and the per-dtype train-inference mismatch (the GPU figures come from the same code on CUDA)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_reduced_gpu_check_on_cpu(tmp_path, tiny_model_path, monkeypatch, capsys):
    pytest.importorskip("bitsandbytes")  # the qlora row (the qlora extra is part of dev)
    monkeypatch.setenv("LIGHTNING_GRPO_CACHE", str(Path(tiny_model_path).parent))
    gpu_check = _gpu_check()
    result = gpu_check.main(["--reduced", "--cache", str(tmp_path)])
    rows = {r["method"]: r for r in result["train"]}
    assert list(rows) == ["full", "lora", "qlora"]
    for r in rows.values():
        assert r["peak_gib"] is None and r["step_s"] > 0 and math.isfinite(r["tokens_per_s"]) and r["tokens_per_s"] > 0
    lora_parameters = 2 * (4 * 16 * (64 + 64) + 3 * 16 * (64 + 128))  # 2 layers, r 16: q k v o (64 -> 64), gate up down
    assert rows["lora"]["trainable"] == rows["qlora"]["trainable"] == lora_parameters
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    with torch.device("meta"):
        vocab = len(AutoTokenizer.from_pretrained(str(tiny_model_path)))
        tiny = Qwen2ForCausalLM(Qwen2Config(vocab_size=vocab, **gpu_check.CONFIGS["tiny"]))
    assert rows["full"]["trainable"] == sum(p.numel() for p in tiny.parameters())
    gaps = {r["dtype"]: r for r in result["mismatch"]}
    assert gaps["float32"]["max_abs"] < 1e-4  # the control: same arithmetic up to float32 rounding
    assert gaps["bfloat16"]["mean_abs"] > 100 * gaps["float32"]["mean_abs"]  # 8-bit mantissas: a real gap
    assert gaps["float16"]["mean_abs"] < gaps["bfloat16"]["mean_abs"]  # 11-bit mantissas narrow it (the fp16 recipes)
    assert all(0 < r["tokens"] <= 2 * 2 * 4 for r in result["mismatch"])  # P x G completions of <= 4 tokens
    printed = capsys.readouterr().out
    assert "| tiny | qlora |" in printed and "| tiny | float16 |" in printed and "CPU" in printed
