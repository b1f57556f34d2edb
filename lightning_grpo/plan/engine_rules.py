"""The run plan's rules about the engine: each looks at the rollout's engine settings (``rollout.engine``, a
typed :class:`~lightning_grpo.rollout.engine_settings.EngineSettings`) together with the module or the Trainer,
reads what the settings say the engine can do (``runs_vllm_here``, ``serves_lora_adapters``,
``samples_live_policy``) and never the engine's name, and raises one error naming the option as written in a recipe.

* the engine: vLLM installed for an engine that runs it in this process; the settings' own ``check`` (on CPU a
  prefill budget, ``max_num_batched_tokens``, of at least the context length and no chunked prefill,
  ``rollout/prefill.py``; ``sleep_level: 2`` only with ``weight_sync.enabled``), once before the data is read
  and once with the plan's context length; ``weight_sync.lora: adapter`` with an engine that serves adapters
  (vllm, with ``lora.enabled``) and ``model.policy.lora``; ``max_staleness >= 1`` only with a loss that corrects
  for the behaviour policy;
* the layout: no ``model.policy.quantization`` (QLoRA) and no engine on the live policy (``hf``) with
  ``trainer.strategy`` ModelParallelStrategy (FSDP2).
"""

from __future__ import annotations

import sys
from importlib.util import find_spec
from typing import TYPE_CHECKING

import lightning as L

if TYPE_CHECKING:
    from ..core import GRPOLoss
    from ..training.module import GRPOModule
    from .rollout_side import RolloutSide

CB = "rollout"


def check_engine(module: GRPOModule, rollout: RolloutSide) -> None:
    """vLLM installed where the engine runs it, the engine settings against the weight sync, the LoRA sync mode
    and the staleness's correction."""
    settings = rollout.engine_settings
    if rollout.engine is None and settings.runs_vllm_here and not vllm_installed():
        from ..rollout.vllm import MISSING_VLLM

        raise ImportError(f"{MISSING_VLLM}; or set {CB}.engine: hf (transformers generate, no vLLM)")
    if rollout.engine is None:
        settings.check(weight_sync_enabled=rollout.sync_enabled, max_model_len=None)
    _check_lora_sync(module, rollout)
    check_async_loss(rollout.max_staleness, module.loss_fn)


def check_async_loss(max_staleness: int, loss: GRPOLoss | None) -> None:
    """Asynchronous batches are sampled by older weights: the loss must correct for the behaviour policy."""
    if max_staleness > 0 and loss is not None and not loss.needs_rollout_logprobs:
        raise ValueError(
            f"rollout.max_staleness={max_staleness} trains on batches sampled by older weights, but the loss has no "
            "off-policy correction: set model.loss.init_args.off_policy.correction (e.g. tis_token)"
        )


def check_prefill(rollout: RolloutSide, context_length: int | None) -> None:
    """The engine settings against the plan's context length (on CPU the engine prefills every prompt whole: its
    budget must hold it, :mod:`~lightning_grpo.rollout.prefill`); nothing for an engine handed over."""
    if rollout.engine is None:
        rollout.engine_settings.check(weight_sync_enabled=rollout.sync_enabled, max_model_len=context_length)


def vllm_installed() -> bool:
    """Whether ``import vllm`` can work (a ``None`` in ``sys.modules`` means an import of it was blocked)."""
    if "vllm" in sys.modules:
        return sys.modules["vllm"] is not None
    return find_spec("vllm") is not None


def _check_lora_sync(module: GRPOModule, rollout: RolloutSide) -> None:
    if rollout.lora_sync != "adapter":
        return
    settings = rollout.engine_settings
    if not settings.serves_lora_adapters:
        raise ValueError(
            f"{CB}.weight_sync.lora='adapter' hands the LoRA adapter to vLLM, but {CB}.engine is "
            f"{settings.name!r}, which takes merged weights only: use weight_sync.lora: merged or engine: vllm"
        )
    if module.lora is None:
        raise ValueError(f"{CB}.weight_sync.lora='adapter' needs a LoRA policy, but model.policy.lora is not set")
    settings.check_lora_adapter()


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
    if rollout is not None and rollout.engine is None and rollout.engine_settings.samples_live_policy:
        raise ValueError(
            f"{CB}.engine {rollout.engine_settings.name!r} generates with the live policy, which trainer.strategy "
            "ModelParallelStrategy (FSDP2) shards (its forward fails on the sharded weights): use engine vllm or "
            "vllm_server (they get the gathered weights), or strategy ddp"
        )
