"""LoRA settings of the policy (``GRPOModule(policy=PolicySettings(lora=LoraSettings(...)))``, ``model.policy.lora`` in a recipe)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
