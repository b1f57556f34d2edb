"""The vLLM engines' defaults that follow the device and the model (`VLLMArgs`, `ServerSettings`).

A setting left at None is decided when the engine is built:

* ``dtype``: float32 on CPU; on a GPU bfloat16 where the GPU supports it, else float16.
* ``kv_cache_memory_bytes``: on CPU, room for every sequence of one generation at full length:
  ``2 (K and V) x layers x kv_heads x head_dim x dtype bytes`` per token, times ``max_model_len``
  rounded up to whole KV blocks (128 tokens unless ``block_size`` says otherwise), times the sequences one
  generation samples at once (prompts per rank x ``sampling.n``); at least :data:`KV_CACHE_FLOOR_BYTES`
  (64 MiB), rounded up to a whole MiB. On a GPU it stays None: vLLM sizes the cache from
  ``gpu_memory_utilization``.

The tiny models need 1 KiB per token, so their runs get the 64 MiB floor; SmolLM2-135M in float32 needs
45 KiB per token, so 64 sequences of 256 tokens take 720 MiB.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from .engine_settings import ENGINE_ARGS

#: Least KV cache a CPU engine gets (bytes): 64 MiB.
KV_CACHE_FLOOR_BYTES = 64 * 2**20
#: vLLM's KV block on CPU when ``block_size`` is not set (tokens).
CPU_BLOCK_SIZE = 128
#: Bytes per element of the engine dtypes.
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
_MIB = 2**20


def default_dtype(cpu: bool) -> str:
    """float32 on CPU; on a GPU bfloat16 where it is supported, else float16."""
    if cpu:
        return "float32"
    import torch

    return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"


def model_config(model_dir: str) -> dict[str, Any]:
    """The ``config.json`` of the checkpoint in ``model_dir`` (a multimodal model's ``text_config`` if it has one)."""
    with open(os.path.join(str(model_dir), "config.json")) as f:
        config = json.load(f)
    return config.get("text_config") or config


def kv_bytes_per_token(config: dict[str, Any], dtype: str) -> int:
    """Bytes one token takes in the KV cache: 2 x layers x kv_heads x head_dim x dtype bytes."""
    layers, heads, hidden = (config.get(k) for k in ("num_hidden_layers", "num_attention_heads", "hidden_size"))
    if not all(isinstance(v, int) and v > 0 for v in (layers, heads, hidden)):
        raise ValueError(
            "the model's config.json has no num_hidden_layers / num_attention_heads / hidden_size to size the "
            f"KV cache from: set {ENGINE_ARGS}.kv_cache_memory_bytes"
        )
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    return 2 * layers * kv_heads * head_dim * DTYPE_BYTES[dtype]


def cpu_kv_cache_bytes(
    config: dict[str, Any], dtype: str, max_model_len: int, sequences: int, block_size: int | None = None
) -> int:
    """The CPU KV cache for ``sequences`` sequences of ``max_model_len`` tokens (the module docstring's rule)."""
    block = block_size or CPU_BLOCK_SIZE
    tokens = math.ceil(max_model_len / block) * block * max(1, sequences)
    needed = max(KV_CACHE_FLOOR_BYTES, kv_bytes_per_token(config, dtype) * tokens)
    return math.ceil(needed / _MIB) * _MIB
