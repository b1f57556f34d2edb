"""The policy loaded from a model folder or hub id: dense or with a 4-bit base (QLoRA), LoRA applied."""

from __future__ import annotations

import torch
from torch import nn

from .lora import LoraSettings, check_target_modules
from .quantization import QuantizationSettings

__all__ = ["apply_lora", "load_policy"]


def load_policy(
    source: str, dtype: str, lora: LoraSettings | None, quantization: QuantizationSettings | None, device: torch.device
) -> nn.Module:
    """``AutoModelForCausalLM`` from ``source`` in ``dtype`` (a QLoRA base built on ``device``), with
    ``lora``'s adapters when given."""
    from transformers import AutoModelForCausalLM

    if quantization is not None:
        from .quantization import load_quantized

        policy = load_quantized(source, dtype, quantization, device)
    else:
        policy = AutoModelForCausalLM.from_pretrained(source, dtype=getattr(torch, dtype))
    return apply_lora(policy, lora) if lora is not None else policy


def apply_lora(policy: nn.Module, lora: LoraSettings) -> nn.Module:
    """``policy`` wrapped by peft with ``lora``'s adapters (every listed target module exists, `check_target_modules`)."""
    check_target_modules(policy, lora)
    from peft import get_peft_model

    return get_peft_model(policy, lora.to_peft())
