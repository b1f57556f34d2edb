"""LoRA settings of the policy (``GRPOModule(policy=PolicySettings(lora=LoraSettings(...)))``, ``model.policy.lora`` in a recipe)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

__all__ = ["LoraSettings", "check_target_modules"]


@dataclass
class LoraSettings:
    """LoRA adapter (peft) on the policy; the reference is then the base model (adapter off)."""

    r: int = 16
    """Rank of the update matrices."""
    alpha: int = 32
    """Scaling: delta_W = alpha / r * B @ A."""
    dropout: float = 0.0
    """Dropout on the adapter input (0 keeps the vLLM merged weights exact)."""
    target_modules: list[str] | str = "all-linear"
    """Module names to adapt, or "all-linear"."""
    init_lora_weights: bool | str = True
    """peft's init; True makes the adapter start as the identity (B = 0)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Further peft ``LoraConfig`` arguments."""

    def to_peft(self):
        from peft import LoraConfig

        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=self.target_modules,
            init_lora_weights=self.init_lora_weights,
            task_type="CAUSAL_LM",
            **self.extra,
        )


def check_target_modules(model: nn.Module, lora: LoraSettings) -> None:
    """Every name of a ``target_modules`` list matches a module of ``model`` as peft matches it (the
    module's name, or its end after a ``.``): peft itself fails only when none does, and a misspelled
    name among right ones would train the others alone. A string (``"all-linear"``, a regex) is peft's to check.

    Raises:
        ValueError: naming ``model.policy.lora.target_modules``, the names that match nothing and the
            adaptable modules the model has (those with a weight matrix).
    """
    if isinstance(lora.target_modules, str):
        return
    names = [name for name, _ in model.named_modules()]
    missing = [t for t in lora.target_modules if not any(n == t or n.endswith(f".{t}") for n in names)]
    if missing:
        raise ValueError(
            f"model.policy.lora.target_modules: {', '.join(map(repr, missing))} "
            f"{'matches' if len(missing) == 1 else 'match'} no module of the model; "
            f"its modules with weights to adapt: {', '.join(adaptable_module_names(model))} (or 'all-linear')"
        )


def adaptable_module_names(model: nn.Module) -> list[str]:
    """The distinct last names of ``model``'s modules that hold a weight matrix (``q_proj``, ``lm_head``, ...),
    in the model's order."""
    found: dict[str, None] = {}
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)  # a transformers / peft / bitsandbytes object (third-party)
        if name and not any(True for _ in module.children()) and isinstance(weight, torch.Tensor) and weight.dim() >= 2:
            found.setdefault(name.rsplit(".", 1)[-1], None)
    return list(found)
