"""The settings of the in-process vLLM engine (``rollout.engine: vllm``), importable without vLLM."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from .engine_settings import ENGINE_ARGS, EngineContext, EngineSettings, register_engine

if TYPE_CHECKING:
    from .base import RolloutEngine


@dataclass(frozen=True)
class VLLMLora:
    """LoRA adapters the in-process engine serves (``rollout.weight_sync.lora: adapter``):
    ``rollout.engine.init_args.lora: {enabled: true, max_rank: 32}``."""

    enabled: bool = False
    """Build the engine able to serve LoRA adapters (vLLM's ``enable_lora``); needed by
    ``rollout.weight_sync.lora: adapter``."""
    max_rank: int = 16
    """Largest adapter rank accepted when ``enabled`` (vLLM's ``max_lora_rank``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.max_rank, int) or self.max_rank < 1:
            raise ValueError(f"{ENGINE_ARGS}.lora.max_rank must be an integer >= 1, got {self.max_rank!r}")


@dataclass(frozen=True)
class VLLMPush:
    """How the policy's weights get into the in-process engine after each optimizer step:
    ``rollout.engine.init_args.weight_push: {mode: reload}``."""

    mode: Literal["auto", "reload", "inplace"] = "auto"
    """How pushed weights get in. "reload": vLLM's ``reload_weights`` (any model, quantisation, parallelism). "inplace": copy into the
    loaded model and repack its CPU GEMM weights (CPU, one process, dense unquantised models; about 3x faster
    at the quickstart size). "auto": "inplace" where it applies."""
    cpu_gemm: Literal["auto", "packed", "plain"] = "auto"
    """Linear kernels of the "inplace" push. "packed": vLLM's oneDNN kernels, repacked at every push.
    "plain": ``torch.nn.functional.linear`` on plain weights, so a push is a copy. "auto": "plain" for
    hidden size <= 128, "packed" above (docs/evidence/benchmarks.md)."""

    def __post_init__(self) -> None:
        if self.mode not in ("auto", "reload", "inplace"):
            raise ValueError(f"{ENGINE_ARGS}.weight_push.mode must be one of auto, reload, inplace; got {self.mode!r}")
        if self.cpu_gemm not in ("auto", "packed", "plain"):
            raise ValueError(
                f"{ENGINE_ARGS}.weight_push.cpu_gemm must be one of auto, packed, plain; got {self.cpu_gemm!r}"
            )


@register_engine
@dataclass
class VLLMArgs(EngineSettings):
    """The in-process vLLM engine (`VLLMEngine`), ``rollout.engine: vllm``.

    ``rollout.engine: {class_path: lightning_grpo.VLLMArgs, init_args: {...}}`` sets its fields.

    Its weights are a copy of the policy's, pushed after every optimizer step. The fields left at None follow
    the device and the model when the engine is built (`lightning_grpo.rollout.engine_defaults`): on CPU
    float32 and a KV cache sized for one generation's sequences at full length (64 MiB at least); on a GPU
    bfloat16 (float16 where bfloat16 is not supported) and a KV cache from ``gpu_memory_utilization``."""

    name: ClassVar[str] = "vllm"
    serves_lora_adapters: ClassVar[bool] = True
    runs_vllm_here: ClassVar[bool] = True

    dtype: Literal["float32", "float16", "bfloat16"] | None = None
    """Engine dtype; pushed weights are cast to it. None = float32 on CPU; on a GPU bfloat16 where supported,
    else float16."""
    max_model_len: int | None = None
    """Longest prompt + completion in tokens. None = the longest prompt of the data (train, val and test
    records) + ``rollout.sampling.max_new_tokens``; a value set smaller than that is refused."""
    kv_cache_memory_bytes: int | None = None
    """KV-cache size in bytes (2 x layers x kv_heads x head_dim x dtype bytes per token). None = on CPU room for
    one generation's sequences (prompts x ``sampling.n``) at ``max_model_len``, 64 MiB at least
    (`lightning_grpo.rollout.engine_defaults`); on a GPU vLLM sizes it from ``gpu_memory_utilization``."""
    block_size: int | None = None
    """KV block size in tokens (CPU: a multiple of 32); None = vLLM's default (128 on CPU). Prefix caching shares
    only whole blocks: with prompts shorter than a block each of a group's samples computes its prompt again, so at
    short prompts on CPU 32 is faster (SmolLM2, 47-token prompts, 8-token answers: 0.45x the generation time in float32;
    docs/evidence/performance.md)."""
    lora: VLLMLora = field(default_factory=VLLMLora)
    """The LoRA adapters the engine serves (`VLLMLora`: ``enabled``, ``max_rank``)."""
    gpu_memory_utilization: float = 0.5
    """Fraction of GPU memory vLLM may use (the rest is the trainer's); ignored on CPU, and for the KV
    cache ignored when ``kv_cache_memory_bytes`` is set."""
    enforce_eager: bool = True
    """No CUDA graphs / compilation, on CPU and GPU alike: the engine's process runs with
    ``TORCHDYNAMO_DISABLE=1`` (no compile at the first log-probs), under which vLLM's compiled mode does not
    start. False on a GPU needs ``TORCHDYNAMO_DISABLE=0`` set before the run."""
    weight_push: VLLMPush = field(default_factory=VLLMPush)
    """How pushed weights get in (`VLLMPush`: ``mode``, ``cpu_gemm``)."""
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
            raise ValueError(f"{ENGINE_ARGS}.max_model_len must be an integer >= 1 or null, got {self.max_model_len!r}")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes < 1:
            raise ValueError(
                f"{ENGINE_ARGS}.kv_cache_memory_bytes must be > 0 or null, got {self.kv_cache_memory_bytes!r}"
            )
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"{ENGINE_ARGS}.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}"
            )
        if "max_model_len" in (self.extra_llm_kwargs or {}):
            raise ValueError(f"{ENGINE_ARGS}.extra_llm_kwargs.max_model_len: set {ENGINE_ARGS}.max_model_len instead")

    def context_limit(self) -> tuple[int | None, str]:
        return self.max_model_len, f"{ENGINE_ARGS}.max_model_len"

    def check(self, *, weight_sync_enabled: bool, max_model_len: int | None) -> None:
        """Sleep level 2 drops the weights, so they must be pushed again; on CPU the prefill budget must hold
        ``max_model_len`` (set, else the derived one) and chunked prefill stay off (`lightning_grpo.rollout.prefill`)."""
        if self.sleep_level == 2 and not weight_sync_enabled:
            raise ValueError(
                f"{ENGINE_ARGS}.sleep_level=2 discards the engine's weights at every sleep, so it needs "
                "rollout.weight_sync.enabled: true (or use sleep_level: 1, which keeps them in CPU memory)"
            )
        from .prefill import cpu_llm_kwargs, is_cpu_platform

        length = self.max_model_len if self.max_model_len is not None else max_model_len
        if length is not None and is_cpu_platform():
            cpu_llm_kwargs(length, self.max_num_batched_tokens, dict(self.extra_llm_kwargs or {}), ENGINE_ARGS)

    def check_lora_adapter(self) -> None:
        if not self.lora.enabled:
            raise ValueError(
                f"rollout.weight_sync.lora='adapter' needs {ENGINE_ARGS}.lora.enabled: true (vLLM serves adapters "
                "only when built with it), or use weight_sync.lora: merged"
            )

    def for_device(self, cpu: bool, config: dict[str, Any], max_model_len: int, sequences: int) -> VLLMArgs:
        """A copy with the fields left at None decided for the device and the model (``config``: its
        ``config.json``; `lightning_grpo.rollout.engine_defaults`)."""
        from .engine_defaults import cpu_kv_cache_bytes, default_dtype

        dtype = self.dtype or default_dtype(cpu)
        kv = self.kv_cache_memory_bytes
        if kv is None and cpu:
            kv = cpu_kv_cache_bytes(config, dtype, max_model_len, sequences, self.block_size)
        return replace(self, dtype=dtype, kv_cache_memory_bytes=kv)

    def build(
        self,
        module: Any,
        tokenizer: Any,
        seed: int,
        context: EngineContext,
        *,
        max_model_len: int | None,
        sequences: int,
    ) -> RolloutEngine:
        """vLLM loads the architecture from a checkpoint directory: the module's model path when it has one,
        otherwise the live policy saved to a temporary directory, which the engine removes when it is closed (or
        here, when it fails to start). The current weights are pushed right after (the callback does it before
        the first generation)."""
        import shutil

        from .model_dir import engine_model_dir
        from .vllm import VLLMEngine

        settings = self if self.max_model_len is not None else replace(self, max_model_len=max_model_len)
        path, temporary = engine_model_dir(module, tokenizer)
        try:
            return VLLMEngine(path, settings, seed=seed, owns_model_dir=temporary, sequences=sequences)
        except BaseException:
            if temporary:
                shutil.rmtree(path, ignore_errors=True)
            raise
