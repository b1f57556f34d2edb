"""The policy's weights as ``(hf_name, tensor)`` pairs, ready to push into a rollout engine.

For a plain HF model the names are its ``state_dict`` keys (the checkpoint names of dense models
such as Llama / Qwen2). For a peft model the LoRA adapters are merged on the fly: each
LoRA-wrapped layer yields ``W + delta_W`` under the base layer's HF name (no ``base_model.model.``
prefix, no ``.base_layer``); adapter tensors themselves are not yielded and the peft model is
never modified (an in-place merge / unmerge would leave rounding drift in the trained weights).
A 4-bit base (QLoRA, bitsandbytes ``Linear4bit``) is dequantised first, so the engine gets dense
weights in the dtype the model was loaded in (:mod:`lightning_grpo.models.quantization`).
Tensors are produced one at a time; merged ones are fresh and dropped once the consumer moves on.

A policy sharded with FSDP2 holds only its shard of each parameter: push inside
:func:`gathered_weights_for_engine`, which all-gathers the full parameters unit by unit (bucketed:
one collective per FSDP2 unit) for the push and reshards afterwards.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


def policy_weights_for_engine(model: nn.Module, merge_lora: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, tensor)`` for every parameter and persistent buffer of ``model`` (detached).

    Args:
        model: an HF model or a peft ``PeftModel`` (LoRA, including variants such as DoRA that peft
            can merge, and ``modules_to_save``).
        merge_lora: True = yield ``W + delta_W`` for LoRA layers (active, unmerged adapters; adapters
            already merged by peft are taken as they stand). False = the base weights alone, for an
            engine that applies the adapter itself (``VLLMEngine.load_lora_adapter``).
    """
    for name, tensor in _walk(_unwrap_peft(model), "", merge_lora, _peft_classes()):
        if hasattr(tensor, "full_tensor"):  # a DTensor: only this rank's shard is here
            raise RuntimeError(
                f"policy_weights_for_engine: {name} is sharded ({type(tensor).__name__}); push inside "
                "gathered_weights_for_engine(model), which all-gathers the full parameters first"
            )
        yield name, tensor


@contextmanager
def gathered_weights_for_engine(
    model: nn.Module, merge_lora: bool = True
) -> Iterator[Iterator[tuple[str, torch.Tensor]]]:
    """:func:`policy_weights_for_engine` with full parameters when ``model`` is FSDP2-sharded (every
    unit all-gathered on entry, resharded on exit; a collective: all ranks enter together). The
    tensors are views of the gathered parameters: consume them inside the ``with`` block."""
    from .fsdp import gathered

    with gathered(model):
        yield policy_weights_for_engine(model, merge_lora)


def _unwrap_peft(model: nn.Module) -> nn.Module:
    """The HF model inside a ``torch.compile`` and/or peft wrapper (``PeftModel.base_model.model``)."""
    model = getattr(model, "_orig_mod", model)  # torch.compile's OptimizedModule
    # any class of the MRO: FSDP2's fully_shard swaps the class for FSDP<cls>, defined in torch's module
    # a transformers / peft / bitsandbytes object (third-party)
    if any(c.__module__.startswith("peft.") for c in type(model).__mro__) and hasattr(model, "get_base_model"):
        return model.get_base_model()
    return model


class _NoPeft:
    """Stands in for peft's classes when peft is not imported (then no peft layer can exist)."""


_PeftClasses = tuple[type, type, tuple[type, ...]]


def _peft_classes() -> _PeftClasses:
    """(LoraLayer, ModulesToSaveWrapper, other peft wrappers we cannot merge)."""
    if "peft" not in sys.modules:
        return _NoPeft, _NoPeft, ()
    from peft.tuners.lora import LoraLayer
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils.other import AuxiliaryTrainingWrapper, ModulesToSaveWrapper

    return LoraLayer, ModulesToSaveWrapper, (BaseTunerLayer, AuxiliaryTrainingWrapper)


def _walk(module: nn.Module, prefix: str, merge_lora: bool, peft: _PeftClasses) -> Iterator[tuple[str, torch.Tensor]]:
    """Depth-first over ``module``'s tree in ``state_dict`` order, resolving peft wrappers."""
    lora_cls, mts_cls, other_cls = peft
    if isinstance(module, lora_cls):
        base = module.get_base_layer()
        for name, param in base.named_parameters(recurse=False):
            dense = _dense(param, prefix + name)
            yield prefix + name, _merged_lora_tensor(module, name, dense, prefix) if merge_lora else dense
        yield from _own_buffers(base, prefix)
        return
    if isinstance(module, mts_cls):
        active = module.active_adapters
        chosen = module.modules_to_save[active[0]] if active and not module.disable_adapters else module.original_module
        yield from _walk(chosen, prefix, merge_lora, peft)
        return
    if other_cls and isinstance(module, other_cls):
        raise NotImplementedError(
            f"policy_weights_for_engine: cannot merge peft module {prefix.rstrip('.')!r} of type "
            f"{type(module).__name__}; supported: LoRA layers and modules_to_save"
        )
    for name, param in module.named_parameters(recurse=False):
        yield prefix + name, _dense(param, prefix + name)
    yield from _own_buffers(module, prefix)
    for name, child in module.named_children():
        yield from _walk(child, f"{prefix}{name}.", merge_lora, peft)


def _dense(param: torch.Tensor, name: str) -> torch.Tensor:
    """``param`` detached; a bitsandbytes 4-bit weight (QLoRA) dequantised to its ``[out, in]`` matrix."""
    from .quantization import dequantized, is_quantized

    if not is_quantized(param):
        return param.detach()

    return dequantized(param, name)


def _own_buffers(module: nn.Module, prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
    for name, buf in module.named_buffers(recurse=False):
        if name not in module._non_persistent_buffers_set:
            yield prefix + name, buf.detach()


@torch.no_grad()
def _merged_lora_tensor(layer: nn.Module, name: str, param: torch.Tensor, prefix: str) -> torch.Tensor:
    """``param`` of ``layer``'s base layer with the active, unmerged adapters added (as peft's merge would)."""
    if layer.disable_adapters and layer.merged:
        raise ValueError(
            f"policy_weights_for_engine: LoRA layer {prefix.rstrip('.')!r} has adapters merged but disabled; "
            "unmerge them (model.unmerge_adapter()) or enable them before pushing weights"
        )
    tensor = param  # already detached (and dequantised for a 4-bit base layer)
    if layer.disable_adapters or layer.merged or name not in ("weight", "bias"):
        return tensor
    for adapter in layer.active_adapters:
        # a transformers / peft / bitsandbytes object (third-party)
        if adapter not in layer.lora_A and adapter not in getattr(layer, "lora_embedding_A", {}):
            continue  # this adapter does not touch this layer
        if name == "bias":
            if layer.lora_bias.get(adapter, False):
                tensor = tensor + layer.lora_B[adapter].bias * layer.scaling[adapter]
        elif adapter in layer.lora_variant:  # DoRA and friends: peft's own out-of-place merge
            tensor = layer.lora_variant[adapter].merge_safe(layer, adapter, tensor.clone())
        else:
            tensor = tensor + layer.get_delta_weight(adapter).to(tensor.dtype)
    return tensor
