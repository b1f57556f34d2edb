"""QLoRA: the policy's base weights in 4 bits (bitsandbytes nf4 / fp4), a LoRA adapter trained on top.

``GRPOModule(quantization=QuantizationSettings(...), lora=LoraSettings(...))`` loads the model
through transformers' ``BitsAndBytesConfig``: every linear layer of the decoder becomes a
``bitsandbytes.nn.Linear4bit`` (blocks of 64 weights share one scale; with ``double_quant`` the
scales are quantised again), the embeddings, norms and the output layer stay in ``model.policy.dtype``.
A layer's forward dequantises its weight to ``compute_dtype`` and multiplies in that dtype, so the
4-bit base costs half a byte per weight at rest and full precision arithmetic. The reference
model is the same network with the adapter switched off (no second copy).

Rollout engines do not run the 4-bit layers: the weight push
(`policy_weights_for_engine`) gives them the dequantised base
with the adapter merged (``rollout.weight_sync.lora: merged``), or the dequantised base once and the adapter after
every step (``weight_sync.lora: adapter``), so the engine computes exactly what the policy computes. ``lightning-grpo export`` rebuilds a QLoRA
checkpoint's policy in its 4-bit layout (`rebuild_quantized`) and writes the same dense,
merged weights (no ``quantization_config``: any engine serves the folder).

bitsandbytes on CPU repacks a layer for a faster bfloat16 kernel the first time it runs in eval
mode without gradients (``_convert_weight_packed_for_cpu``): that rounds its scales to bfloat16 and
the kernel passes no gradient to the layer's input. `load_quantized` switches the repacking
off, so evaluation, training and the engine's copy all see the same weights.
"""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

MISSING_BITSANDBYTES = "model.policy.quantization (QLoRA) needs bitsandbytes: pip install 'lightning-grpo[qlora]'"


@dataclass
class QuantizationSettings:
    """4-bit base weights for QLoRA (transformers' ``BitsAndBytesConfig(load_in_4bit=True, ...)``)."""

    quant_type: Literal["nf4", "fp4"] = "nf4"
    """4-bit data type: "nf4" (NormalFloat, for normally distributed weights; QLoRA's choice) or "fp4"."""
    double_quant: bool = True
    """Quantise the per-block scales too (8-bit, blocks of 256): about 0.37 bits per weight saved."""
    compute_dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """dtype each 4-bit weight is dequantised to for its matmul; None = ``model.policy.dtype``."""
    skip_modules: list[str] | None = None
    """Module names kept unquantised (``llm_int8_skip_modules``); None = transformers' default (the output layer)."""

    def __post_init__(self) -> None:
        if self.quant_type not in ("nf4", "fp4"):
            raise ValueError(f"model.policy.quantization.quant_type must be 'nf4' or 'fp4', got {self.quant_type!r}")
        if self.compute_dtype not in (None, "float32", "bfloat16", "float16"):
            raise ValueError(
                f"model.policy.quantization.compute_dtype must be float32, bfloat16, float16 or null, got {self.compute_dtype!r}"
            )

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> QuantizationSettings:
        """The settings of a model config's ``quantization_config`` (bitsandbytes 4-bit, as ``to_dict`` writes it)."""
        compute = config.get("bnb_4bit_compute_dtype")
        return cls(
            quant_type=config.get("bnb_4bit_quant_type", "nf4"),
            double_quant=bool(config.get("bnb_4bit_use_double_quant")),
            compute_dtype=None if compute is None else str(compute).removeprefix("torch."),
            skip_modules=config.get("llm_int8_skip_modules"),
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
        raise ValueError(
            "model.policy.quantization needs model.policy.lora: the 4-bit base weights are frozen, QLoRA trains a LoRA adapter on them"
        )
    if isinstance(model, nn.Module):
        raise ValueError(
            f"model.policy.quantization loads a model path in 4 bits, but model is an nn.Module ({type(model).__name__}): "
            "pass its path, or quantise it yourself and leave quantization unset"
        )
    require_bitsandbytes()
    return quantization


def require_bitsandbytes() -> None:
    """Raise the ImportError naming the ``qlora`` extra when bitsandbytes is not installed."""
    if find_spec("bitsandbytes") is None:
        raise ImportError(MISSING_BITSANDBYTES)


def load_quantized(source: str, dtype: str, settings: QuantizationSettings | None, device: torch.device) -> nn.Module:
    """``AutoModelForCausalLM`` from ``source`` with 4-bit linear layers, placed on ``device``
    (bitsandbytes quantises each weight as it is loaded there). ``settings`` None: ``source`` is
    already quantised (its config's ``quantization_config``; the weights are loaded as saved)."""
    from transformers import AutoModelForCausalLM

    quantization = {} if settings is None else {"quantization_config": settings.to_bitsandbytes(dtype)}
    model = AutoModelForCausalLM.from_pretrained(
        source, dtype=getattr(torch, dtype), device_map={"": str(device)}, **quantization
    )
    keep_float_kernels(model)
    return model


def keep_float_kernels(model: nn.Module) -> None:
    """Stop bitsandbytes from repacking ``model``'s 4-bit layers for its bfloat16 CPU kernel
    (see the module docstring); on GPU the flag is unused."""
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):  # a transformers / peft / bitsandbytes object (third-party)
            module.support_avx512bf16_for_cpu = False


#: A peft adapter tensor's name: a LoRA weight (``lora_A``, ``lora_B``, ``lora_embedding_A``, DoRA's
#: ``lora_magnitude_vector``) or a trained copy of a whole module (``modules_to_save``).
_ADAPTER_NAME = re.compile(r"(^|\.)(lora_\w+|modules_to_save)\.")


def split_peft_state(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A peft model's state dict as (the base model's tensors under their HF names, the adapter's
    tensors under the peft names): ``base_model.model.`` and ``.base_layer`` / ``.original_module``
    dropped from the base names (a 4-bit weight's quantisation state ``weight.absmax``, ... included)."""
    base, adapter = {}, {}
    for name, tensor in state.items():
        if _ADAPTER_NAME.search(name):
            adapter[name] = tensor
        else:
            hf = name.removeprefix("base_model.model.").replace(".base_layer.", ".").replace(".original_module.", ".")
            base[hf] = tensor
    return base, adapter


def rebuild_quantized(
    state: dict[str, torch.Tensor], config: dict[str, Any], settings: QuantizationSettings, dtype: str, peft_config: Any
) -> nn.Module:
    """A QLoRA checkpoint's policy as it was trained: the base's 4-bit weights loaded as they were saved
    (transformers reads a pre-quantised bitsandbytes folder; nothing is quantised again), the LoRA
    adapter ``peft_config`` on top with its trained tensors. ``state``: the peft model's state dict,
    ``config``: the base model's config without ``quantization_config``."""
    from peft import get_peft_model
    from safetensors.torch import save_file

    base, adapter = split_peft_state(state)
    with tempfile.TemporaryDirectory(prefix="lightning-grpo-qlora-") as folder:
        quantization = settings.to_bitsandbytes(dtype).to_dict()
        Path(folder, "config.json").write_text(json.dumps({**config, "quantization_config": quantization}, default=str))
        save_file({k: v.contiguous() for k, v in base.items()}, str(Path(folder, "model.safetensors")))
        model = get_peft_model(load_quantized(folder, dtype, None, torch.device("cpu")), peft_config)
    expected = {name for name in model.state_dict() if _ADAPTER_NAME.search(name)}
    if set(adapter) != expected:
        raise ValueError(
            f"the checkpoint's adapter does not match its LoRA settings: missing {sorted(expected - set(adapter))[:4]}, "
            f"unexpected {sorted(set(adapter) - expected)[:4]}"
        )
    model.load_state_dict(adapter, strict=False)
    return model.eval()


#: The tensors bitsandbytes saves beside a 4-bit weight (its quantisation state), which
#: ``nn.Module.load_state_dict`` does not take back: ``...weight.absmax``, ``...weight.quant_map``, ...
_QUANT_STATE_KEY = re.compile(r"\.weight\.(absmax|quant_map|nested_absmax|nested_quant_map|quant_state\..+)$")


def take_quant_state(checkpoint_state: dict[str, torch.Tensor], module: nn.Module) -> None:
    """Remove the 4-bit weights' quantisation-state tensors from a checkpoint's ``state_dict`` before
    Lightning loads it into ``module`` (a resumed QLoRA run), after checking that they equal the
    module's own: the frozen 4-bit base is rebuilt from ``model.model`` when the run starts, so the
    checkpoint must hold the same base. Raises one ValueError naming the first tensor that differs."""
    keys = [key for key in checkpoint_state if _QUANT_STATE_KEY.search(key)]
    if not keys:
        return
    own = module.state_dict()
    for key in keys:
        theirs, mine = checkpoint_state.pop(key), own.get(key)
        if mine is None or not torch.equal(theirs.cpu(), mine.cpu()):
            raise ValueError(
                f"the checkpoint's 4-bit base differs from the one built from model.model ({key}): resume a QLoRA "
                "run with the model.model and model.policy.quantization it was trained with"
            )


def is_quantized(param: torch.Tensor) -> bool:
    """True for a bitsandbytes 4-bit weight (``Params4bit`` with its quantisation state): the one
    check (the weight push and the model-folder writer dequantise exactly these)."""
    # a transformers / peft / bitsandbytes object (third-party)
    return getattr(param, "quant_state", None) is not None


@torch.no_grad()
def dequantized(param: torch.Tensor, name: str) -> torch.Tensor:
    """The dense ``[out, in]`` weight of a bitsandbytes 4-bit parameter, in the dtype it was loaded in.

    Raises a ValueError naming the parameter if bitsandbytes repacked it for its CPU inference
    kernel (scales rounded to bfloat16: the policy no longer computes with the weights it trains on)."""
    state = param.quant_state
    if getattr(state, "packing_format_for_cpu", False):  # a transformers / peft / bitsandbytes object (third-party)
        raise ValueError(
            f"{name} was repacked by bitsandbytes for its bfloat16 CPU kernel (an eval-mode forward without "
            "gradients), which rounds its scales and passes no gradient to the layer's input: load the model with "
            "GRPOModule(quantization=...), or call lightning_grpo.models.quantization.keep_float_kernels(model) right "
            "after loading it"
        )
    from bitsandbytes.functional import dequantize_4bit

    return dequantize_4bit(param.data, state)  # [out, in], state.dtype
