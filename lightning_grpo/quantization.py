"""QLoRA: the policy's base weights in 4 bits (bitsandbytes nf4 / fp4), a LoRA adapter trained on top.

``GRPOModule(quantization=QuantizationSettings(...), lora=LoraSettings(...))`` loads the model
through transformers' ``BitsAndBytesConfig``: every linear layer of the decoder becomes a
``bitsandbytes.nn.Linear4bit`` (blocks of 64 weights share one scale; with ``double_quant`` the
scales are quantised again), the embeddings, norms and the output layer stay in ``model.dtype``.
A layer's forward dequantises its weight to ``compute_dtype`` and multiplies in that dtype, so the
4-bit base costs half a byte per weight at rest and full precision arithmetic. The reference
model is the same network with the adapter switched off (no second copy).

Rollout engines do not run the 4-bit layers: the weight push
(:func:`~lightning_grpo.rollout.weights.policy_weights_for_engine`) gives them the dequantised base
with the adapter merged (``lora_sync: merged``), or the dequantised base once and the adapter after
every step (``lora_sync: adapter``), so the engine computes exactly what the policy computes.

bitsandbytes on CPU repacks a layer for a faster bfloat16 kernel the first time it runs in eval
mode without gradients (``_convert_weight_packed_for_cpu``): that rounds its scales to bfloat16 and
the kernel passes no gradient to the layer's input. :func:`load_quantized` switches the repacking
off, so evaluation, training and the engine's copy all see the same weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.util import find_spec
from typing import Any, Literal

import torch
from torch import nn

MISSING_BITSANDBYTES = "model.quantization (QLoRA) needs bitsandbytes: pip install 'lightning-grpo[qlora]'"


@dataclass
class QuantizationSettings:
    """4-bit base weights for QLoRA (transformers' ``BitsAndBytesConfig(load_in_4bit=True, ...)``)."""

    quant_type: Literal["nf4", "fp4"] = "nf4"
    """4-bit data type: "nf4" (NormalFloat, for normally distributed weights; QLoRA's choice) or "fp4"."""
    double_quant: bool = True
    """Quantise the per-block scales too (8-bit, blocks of 256): about 0.37 bits per weight saved."""
    compute_dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """dtype each 4-bit weight is dequantised to for its matmul; None = ``model.dtype``."""
    skip_modules: list[str] | None = None
    """Module names kept unquantised (``llm_int8_skip_modules``); None = transformers' default (the output layer)."""

    def __post_init__(self) -> None:
        if self.quant_type not in ("nf4", "fp4"):
            raise ValueError(f"model.quantization.quant_type must be 'nf4' or 'fp4', got {self.quant_type!r}")
        if self.compute_dtype not in (None, "float32", "bfloat16", "float16"):
            raise ValueError(
                f"model.quantization.compute_dtype must be float32, bfloat16, float16 or null, got {self.compute_dtype!r}"
            )

    def to_bitsandbytes(self, dtype: str) -> Any:
        """The ``BitsAndBytesConfig`` for a model loaded in ``dtype`` (the dtype of what stays unquantised)."""
        require_bitsandbytes()
        from transformers import BitsAndBytesConfig

        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=self.quant_type,
            bnb_4bit_use_double_quant=self.double_quant,
            bnb_4bit_compute_dtype=getattr(torch, self.compute_dtype or dtype),
            llm_int8_skip_modules=self.skip_modules,
        )


def check_quantization(quantization: Any, has_lora: bool, model: Any) -> QuantizationSettings | None:
    """``GRPOModule``'s QLoRA settings (a dict under LightningCLI), checked before anything loads: a
    LoRA adapter to train, a model path to load, bitsandbytes installed."""
    if quantization is None:
        return None
    if isinstance(quantization, dict):
        quantization = QuantizationSettings(**quantization)
    if not has_lora:
        raise ValueError("model.quantization needs model.lora: the 4-bit base weights are frozen, QLoRA trains a LoRA adapter on them")
    if isinstance(model, nn.Module):
        raise ValueError(
            f"model.quantization loads a model path in 4 bits, but model is an nn.Module ({type(model).__name__}): "
            "pass its path, or quantise it yourself and leave quantization unset"
        )
    require_bitsandbytes()
    return quantization


def require_bitsandbytes() -> None:
    """Raise the ImportError naming the ``qlora`` extra when bitsandbytes is not installed."""
    if find_spec("bitsandbytes") is None:
        raise ImportError(MISSING_BITSANDBYTES)


def load_quantized(source: str, dtype: str, settings: QuantizationSettings, device: torch.device) -> nn.Module:
    """``AutoModelForCausalLM`` from ``source`` with 4-bit linear layers, placed on ``device``
    (bitsandbytes quantises each weight as it is loaded there)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        source,
        dtype=getattr(torch, dtype),
        quantization_config=settings.to_bitsandbytes(dtype),
        device_map={"": str(device)},
    )
    keep_float_kernels(model)
    return model


def keep_float_kernels(model: nn.Module) -> None:
    """Stop bitsandbytes from repacking ``model``'s 4-bit layers for its bfloat16 CPU kernel
    (see the module docstring); on GPU the flag is unused."""
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False


def is_quantized(param: torch.Tensor) -> bool:
    """True for a bitsandbytes 4-bit weight (``Params4bit`` with its quantisation state)."""
    return getattr(param, "quant_state", None) is not None


@torch.no_grad()
def dequantized(param: torch.Tensor, name: str) -> torch.Tensor:
    """The dense ``[out, in]`` weight of a bitsandbytes 4-bit parameter, in the dtype it was loaded in.

    Raises a ValueError naming the parameter if bitsandbytes repacked it for its CPU inference
    kernel (scales rounded to bfloat16: the policy no longer computes with the weights it trains on)."""
    state = param.quant_state
    if getattr(state, "packing_format_for_cpu", False):
        raise ValueError(
            f"{name} was repacked by bitsandbytes for its bfloat16 CPU kernel (an eval-mode forward without "
            "gradients), which rounds its scales and passes no gradient to the layer's input: load the model with "
            "GRPOModule(quantization=...), or call lightning_grpo.quantization.keep_float_kernels(model) right "
            "after loading it"
        )
    from bitsandbytes.functional import dequantize_4bit

    return dequantize_4bit(param.data, state)  # [out, in], state.dtype
