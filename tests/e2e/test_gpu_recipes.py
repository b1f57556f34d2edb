"""benchmarks/gpu_recipes.py: the script's mechanics run on CPU (--smoke: the tiny model, short rows),
training the derived configurations through ``lightning-grpo fit``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _gpu_recipes():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("gpu_recipes", ROOT / "benchmarks" / "gpu_recipes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_smoke_runs_the_agent_and_qlora_recipes_on_cpu(tmp_path, tiny_model_path, monkeypatch):
    """The derived configuration trains through ``lightning-grpo fit`` (agent recipe as a plain rollout)."""
    pytest.importorskip("bitsandbytes")
    monkeypatch.setenv("LIGHTNING_GRPO_CACHE", str(Path(tiny_model_path).parent))
    gpu_recipes = _gpu_recipes()
    for name in ("qwen2.5-1.5b_gsm8k_tools.yaml", "qwen2.5-7b_qlora_32gb.yaml"):
        row = gpu_recipes.child(ROOT / "recipes" / name, steps=2, cache=tmp_path, smoke=True)
        assert row["arch"] == "tiny" and row["trainable"] > 0 and row["train_s"] > 0, row
