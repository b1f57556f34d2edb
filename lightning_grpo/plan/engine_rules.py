"""The run plan's rules about the engine: each looks at the rollout's engine settings together with the
module or the Trainer, and raises one error naming the option as written in a recipe.

* the engine: a known name; ``engine: vllm`` with vLLM installed; on CPU a KV cache size
  (``rollout.vllm.kv_cache_memory_bytes``, ``rollout.server.kv_cache_memory_bytes``), a prefill budget
  (``max_num_batched_tokens``) of at least the context length and no chunked prefill (``rollout/prefill.py``);
  ``weight_sync.lora: adapter`` with engine vllm, ``rollout.vllm.enable_lora`` and ``model.policy.lora``;
  ``rollout.vllm.sleep_level: 2`` only with ``weight_sync.enabled``; ``max_staleness >= 1`` only with a loss
  that corrects for the behaviour policy;
* the layout: no ``model.policy.quantization`` (QLoRA) and no ``engine: hf`` with ``trainer.strategy``
  ModelParallelStrategy (FSDP2).
"""

from __future__ import annotations

import os
import sys
from importlib.util import find_spec
from typing import TYPE_CHECKING

import lightning as L

from ..rollout.prefill import cpu_llm_kwargs, is_cpu_platform
from ..rollout.vllm_args import VLLMArgs
from ..rollout.vllm_server import ServerSettings

if TYPE_CHECKING:
    from ..core import GRPOLoss
    from ..training.module import GRPOModule
    from .rollout_side import RolloutSide

CB = "rollout"


def check_engine(module: GRPOModule, rollout: RolloutSide) -> None:
    """Engine name, vLLM installed, engine settings, the LoRA sync mode and the staleness's correction."""
    from ..rollout.factory import ENGINES

    name = rollout.engine_name
    if name not in ENGINES:
        raise ValueError(f"{CB}.engine: unknown rollout engine {name!r}; valid names: {', '.join(ENGINES.names())}")
    if rollout.engine is None and name == "vllm" and not vllm_installed():
        from ..rollout.vllm import MISSING_VLLM

        raise ImportError(f"{MISSING_VLLM}; or set {CB}.engine: hf (transformers generate, no vLLM)")
    if rollout.engine is None:
        _check_kv_cache(rollout)
    settings = rollout.engine_settings
    if isinstance(settings, VLLMArgs) and settings.sleep_level == 2 and not rollout.sync_enabled:
        raise ValueError(
            f"{CB}.vllm.sleep_level=2 discards the engine's weights at every sleep, so it needs "
            f"{CB}.weight_sync.enabled: true (or use sleep_level: 1, which keeps them in CPU memory)"
        )
    _check_lora_sync(module, rollout)
    check_async_loss(rollout.max_staleness, module.loss_fn)


def check_async_loss(max_staleness: int, loss: GRPOLoss | None) -> None:
    """Asynchronous batches are sampled by older weights: the loss must correct for the behaviour policy."""
    if max_staleness > 0 and loss is not None and not loss.needs_rollout_logprobs:
        raise ValueError(
            f"rollout.max_staleness={max_staleness} trains on batches sampled by older weights, but the loss has no "
            "off-policy correction: set model.loss.init_args.off_policy.correction (e.g. tis_token)"
        )


def _check_kv_cache(rollout: RolloutSide) -> None:
    """On CPU a KV cache left to vLLM takes about 90% of a NUMA node: the size must be set."""
    settings = rollout.engine_settings
    if isinstance(settings, VLLMArgs):
        size, field = settings.kv_cache_memory_bytes, f"{CB}.vllm.kv_cache_memory_bytes"
    elif isinstance(settings, ServerSettings) and settings.urls is None:
        size, field = settings.kv_cache_memory_bytes, f"{CB}.server.kv_cache_memory_bytes"
    else:
        return
    if size is None and "VLLM_CPU_KVCACHE_SPACE" not in os.environ and is_cpu_platform():
        raise ValueError(
            f"{field} is not set: on CPU vLLM would reserve about 90% of a NUMA node for the KV cache; set it "
            "(67108864, 64 MiB, suits the tiny models)"
        )


def check_prefill(settings: VLLMArgs | ServerSettings | None) -> None:
    """On CPU the engine prefills every prompt whole: its budget must hold the context length (``max_model_len`` of
    the settings the engine is built with) and chunked prefill must stay off (:mod:`~lightning_grpo.rollout.prefill`)."""
    if isinstance(settings, ServerSettings):
        settings.check_prefill()
    elif isinstance(settings, VLLMArgs) and settings.max_model_len is not None and is_cpu_platform():
        extra = dict(settings.extra_llm_kwargs or {})
        cpu_llm_kwargs(settings.max_model_len, settings.max_num_batched_tokens, extra, f"{CB}.vllm")


def vllm_installed() -> bool:
    """Whether ``import vllm`` can work (a ``None`` in ``sys.modules`` means an import of it was blocked)."""
    if "vllm" in sys.modules:
        return sys.modules["vllm"] is not None
    return find_spec("vllm") is not None


def _check_lora_sync(module: GRPOModule, rollout: RolloutSide) -> None:
    if rollout.lora_sync != "adapter":
        return
    if rollout.engine_name != "vllm":
        raise ValueError(
            f"{CB}.weight_sync.lora='adapter' hands the LoRA adapter to vLLM, but {CB}.engine is "
            f"{rollout.engine_name!r} (it samples from the live policy): use weight_sync.lora: merged or engine: vllm"
        )
    if module.lora is None:
        raise ValueError(f"{CB}.weight_sync.lora='adapter' needs a LoRA policy, but model.policy.lora is not set")
    if not rollout.engine_settings.enable_lora:
        raise ValueError(
            f"{CB}.weight_sync.lora='adapter' needs {CB}.vllm.enable_lora: true (vLLM serves adapters only "
            "when built with it), or use weight_sync.lora: merged"
        )


def check_layout(trainer: L.Trainer, module: GRPOModule, rollout: RolloutSide | None = None) -> None:
    """Options the process layout cannot combine with (before the launcher starts the ranks)."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    if not isinstance(trainer.strategy, ModelParallelStrategy):
        return
    if module.quantization is not None:
        raise ValueError(
            "model.policy.quantization (QLoRA) does not shard with trainer.strategy ModelParallelStrategy (FSDP2): "
            "use strategy ddp or one device, or train without model.policy.quantization"
        )
    if rollout is not None and rollout.engine is None and rollout.engine_name == "hf":
        raise ValueError(
            f"{CB}.engine 'hf' generates with the live policy, which trainer.strategy ModelParallelStrategy (FSDP2) "
            "shards (its forward fails on the sharded weights): use engine vllm or vllm_server (they get the gathered "
            "weights), or strategy ddp"
        )
