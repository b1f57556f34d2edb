"""The policy -> engine weight push of :class:`~lightning_grpo.RolloutCallback`, for both LoRA modes.

``rollout.weight_sync.lora: merged`` (and every non-LoRA policy): one push of every weight, LoRA layers as
``W + delta_W`` (a 4-bit QLoRA base dequantised first; :mod:`lightning_grpo.models.weights`).

``rollout.weight_sync.lora: adapter``: vLLM applies the adapter itself. The base weights (dequantised for QLoRA)
are pushed once, and again only when the engine lost them (sleep level 2) or when the policy trains
weights outside the adapter (peft ``modules_to_save``); after every optimizer step the adapter is
saved to a fresh directory (only its LoRA matrices: modules trained in full reach the engine with
the base weights) and handed to the engine (``VLLMEngine.load_lora_adapter``). vLLM reads the files
at its next generation, so the previous directory is removed only when the next one replaces it.
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Literal

from torch import nn

from ..rollout.base import RolloutEngine


class PolicyPush:
    """Pushes the policy into a rollout engine (see the module docstring)."""

    def __init__(self, lora: Literal["merged", "adapter"] = "merged") -> None:
        self.lora = lora
        self._adapter_dir: str | None = None

    def __call__(self, engine: RolloutEngine, policy: nn.Module, step: int, first: bool) -> None:
        """Push ``policy`` as weight version ``step``; ``first``: the engine never got this policy's weights."""
        from ..models.weights import gathered_weights_for_engine

        adapter = self.lora == "adapter"
        if not adapter or first or engine.weights_discarded or _trains_outside_adapter(policy):
            with gathered_weights_for_engine(policy, merge_lora=not adapter) as weights:  # full parameters under FSDP2
                engine.load_weights(weights, version=step)  # servers tag each sample with the version
        if adapter:
            self._push_adapter(engine, policy)

    def _push_adapter(self, engine: RolloutEngine, policy: nn.Module) -> None:
        directory = tempfile.mkdtemp(prefix="lightning-grpo-adapter-")
        save_adapter(policy, directory)
        engine.load_lora_adapter(directory)
        self.close()
        self._adapter_dir = directory

    def close(self) -> None:
        """Remove the last adapter directory."""
        if self._adapter_dir is not None:
            shutil.rmtree(self._adapter_dir, ignore_errors=True)
            self._adapter_dir = None


def _trains_outside_adapter(policy: nn.Module) -> bool:
    """True when a trainable parameter is not a LoRA matrix (peft ``modules_to_save``, ...)."""
    return any(p.requires_grad and "lora_" not in name for name, p in policy.named_parameters())


def save_adapter(policy: nn.Module, directory: str) -> None:
    """Save ``policy``'s active LoRA adapter (``adapter_config.json`` + weights) for vLLM: its LoRA
    matrices only, ``modules_to_save`` left out of both files (vLLM takes LoRA target modules only)."""
    import copy

    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    from ..models.fsdp import gathered

    name = policy.active_adapter
    config = copy.deepcopy(policy.peft_config[name])
    config.modules_to_save = None
    with gathered(policy):  # full adapter matrices under FSDP2
        state = get_peft_model_state_dict(policy, adapter_name=name)
        lora_only = {k: v.detach().cpu().contiguous() for k, v in state.items() if "lora_" in k}
    config.save_pretrained(directory)
    save_file(lora_only, f"{directory}/adapter_model.safetensors")
