"""VLLMEngine construction without a real vLLM: the missing-package error, LLM arguments, RNG care."""

from __future__ import annotations

import json
import random
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import lightning_grpo.rollout.vllm as vllm_module
from lightning_grpo.rollout.vllm import MISSING_VLLM, VLLMEngine
from lightning_grpo.rollout.vllm_args import VLLMArgs, VLLMLora


def test_missing_vllm_raises_the_install_hint(monkeypatch, tiny_model_path):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    with pytest.raises(ImportError) as info:
        VLLMEngine(str(tiny_model_path), VLLMArgs())
    assert str(info.value) == (
        "engine='vllm' needs vLLM: pip install 'lightning-grpo[cpu]' (CPU) or 'lightning-grpo[gpu]' (CUDA)"
    )
    assert str(info.value) == MISSING_VLLM


class _ReseedingLLM:
    """Stands in for vllm.LLM: records its arguments and reseeds the global RNGs like LLM(seed=...) does."""

    last_kwargs: dict = {}

    def __init__(self, **kwargs):
        type(self).last_kwargs = kwargs
        random.seed(kwargs["seed"])
        np.random.seed(kwargs["seed"])
        torch.manual_seed(kwargs["seed"])


@pytest.fixture
def fake_vllm(monkeypatch):
    monkeypatch.setattr(vllm_module, "import_vllm", lambda: types.SimpleNamespace(LLM=_ReseedingLLM))


def test_construction_passes_the_engine_settings_and_keeps_the_global_rng(fake_vllm, tiny_model_path):
    torch.manual_seed(1234)
    random.seed(1234)
    np.random.seed(1234)
    states = (torch.random.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    extra = {"max_num_seqs": 64, "enable_prefix_caching": False}  # extra_llm_kwargs may override our settings
    VLLMEngine(
        str(tiny_model_path),
        VLLMArgs(kv_cache_memory_bytes=64 * 1024**2, block_size=32, extra_llm_kwargs=extra),
        seed=7,
    )
    assert torch.equal(torch.random.get_rng_state(), states[0])
    assert random.getstate() == states[1]
    assert np.array_equal(np.random.get_state()[1], states[2])
    kwargs = _ReseedingLLM.last_kwargs
    assert kwargs["model"] == str(tiny_model_path) and kwargs["seed"] == 7
    assert kwargs["logprobs_mode"] == "processed_logprobs" and kwargs["skip_tokenizer_init"] is True
    assert kwargs["dtype"] == "float32" and kwargs["kv_cache_memory_bytes"] == 64 * 1024**2
    assert kwargs["enforce_eager"] is True and kwargs["block_size"] == 32
    assert kwargs["max_num_seqs"] == 64 and kwargs["enable_prefix_caching"] is False
    assert "enable_lora" not in kwargs
    config = json.loads((Path(tiny_model_path) / "config.json").read_text())
    assert kwargs["max_model_len"] == config["max_position_embeddings"]  # not set: the model's own


def test_lora_settings_are_passed_when_enabled(fake_vllm, tiny_model_path):
    VLLMEngine(str(tiny_model_path), VLLMArgs(lora=VLLMLora(enabled=True, max_rank=32)))
    kwargs = _ReseedingLLM.last_kwargs
    assert kwargs["enable_lora"] is True and kwargs["max_lora_rank"] == 32


def test_rejects_a_bad_dtype_and_a_missing_checkpoint(fake_vllm, tiny_model_path, tmp_path):
    expected = r"VLLMEngine dtype must be one of \['bfloat16', 'float16', 'float32'\], got 'fp8'"
    with pytest.raises(ValueError, match=expected):
        VLLMEngine(str(tiny_model_path), VLLMArgs(dtype="fp8"))
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        VLLMEngine(str(tmp_path), VLLMArgs())
