"""The settings of the in-process vLLM engine (``rollout.vllm``), importable without vLLM."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


@dataclass
class VLLMArgs:
    """The in-process engine (``engine: vllm``): `VLLMEngine`'s settings.

    The defaults suit a GPU. On CPU set ``kv_cache_memory_bytes`` (vLLM would otherwise reserve about 90% of
    a NUMA node for the KV cache); the CPU recipes use 67108864 (64 MiB)."""

    dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    """Engine dtype; pushed weights are cast to it."""
    max_model_len: int | None = None
    """Longest prompt + completion in tokens. None = the longest prompt of the data (train, val and test
    records) + ``rollout.sampling.max_new_tokens``; a value set smaller than that is refused."""
    kv_cache_memory_bytes: int | None = None
    """KV-cache size in bytes (about 2 x layers x kv_heads x head_dim x dtype bytes per token). None = vLLM
    sizes it from ``gpu_memory_utilization`` (GPU). Set it on CPU (e.g. 67108864, 64 MiB, for the tiny models)."""
    block_size: int | None = None
    """KV block size in tokens (CPU: a multiple of 32); None = vLLM's default (128 on CPU)."""
    enable_lora: bool = False
    """Serve LoRA adapters (``rollout.weight_sync.lora: adapter``)."""
    max_lora_rank: int = 16
    """Largest adapter rank accepted when ``enable_lora``."""
    gpu_memory_utilization: float = 0.5
    """Fraction of GPU memory vLLM may use (the rest is the trainer's); ignored on CPU, and for the KV
    cache ignored when ``kv_cache_memory_bytes`` is set."""
    enforce_eager: bool = True
    """No CUDA graphs / compilation (keep True on CPU)."""
    weight_push: Literal["auto", "reload", "inplace"] = "auto"
    """How pushed weights get in. "reload": vLLM's ``reload_weights`` (any model, quantisation,
    parallelism). "inplace": copy into the loaded model and repack its CPU GEMM weights (CPU, one process,
    dense unquantised models; about 3x faster at the quickstart size). "auto": "inplace" where it applies."""
    cpu_gemm: Literal["auto", "packed", "plain"] = "auto"
    """Linear kernels of the "inplace" push. "packed": vLLM's oneDNN kernels, repacked at every push.
    "plain": ``torch.nn.functional.linear`` on plain weights, so a push is a copy. "auto": "plain" for
    hidden size <= 128, "packed" above (docs/evidence/benchmarks.md)."""
    max_num_batched_tokens: int | None = None
    """Tokens one scheduler step may prefill. On CPU chunked prefill is off, so it must be at least
    ``max_model_len``; None = ``max(max_model_len, 4096)`` on CPU, vLLM's default on GPU."""
    sleep_level: int = 0
    """Release the engine's GPU memory between generations: 0 = off; 1 = weights offloaded to CPU memory,
    KV cache dropped; 2 = both dropped (needs ``rollout.weight_sync.enabled``)."""
    extra_llm_kwargs: dict[str, Any] | None = None
    """More keyword arguments for ``vllm.LLM`` (they override the ones above, except ``max_model_len``,
    which is set here only)."""

    def __post_init__(self) -> None:
        if self.max_model_len is not None and (not isinstance(self.max_model_len, int) or self.max_model_len < 1):
            raise ValueError(f"rollout.vllm.max_model_len must be an integer >= 1 or null, got {self.max_model_len!r}")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes < 1:
            raise ValueError(
                f"rollout.vllm.kv_cache_memory_bytes must be > 0 or null, got {self.kv_cache_memory_bytes!r}"
            )
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"rollout.vllm.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}"
            )
        if "max_model_len" in (self.extra_llm_kwargs or {}):
            raise ValueError("rollout.vllm.extra_llm_kwargs.max_model_len: set rollout.vllm.max_model_len instead")
