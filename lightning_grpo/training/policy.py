"""The policy of a LightningModule, built one way for every module that trains one (GRPOModule, SFTModule).

:class:`PolicyMixin` holds what both modules share: the model source (a model folder / hub id, an
``nn.Module``, or a built-in tiny model by name), the load dtype, LoRA (:mod:`lightning_grpo.models.lora`),
QLoRA (:mod:`lightning_grpo.models.quantization`), gradient checkpointing, the trainer's precision
context, the optimizer / scheduler callables, and what a checkpoint stores for ``lightning-grpo export``
(:func:`~lightning_grpo.models.export.export_info`; the 4-bit state rebuilt on load). A module calls
:meth:`PolicyMixin._init_policy` in ``__init__`` (after setting ``policy_settings``, a
:class:`~lightning_grpo.training.settings.PolicySettings`) and :meth:`PolicyMixin._build_policy` in ``configure_model``.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Protocol, runtime_checkable

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn

from ..models.loading import apply_lora, load_policy
from ..models.lora import LoraSettings
from ..models.quantization import check_quantization, take_quant_state
from .low_precision import rounded_away_warning
from .settings import PolicySettings


@runtime_checkable
class RunData(Protocol):
    """What a module reads from the run's data module (`lightning_grpo.data.PromptDataModule`, which the training
    folder does not import): its tokenizer and, once set up, its training rows."""

    tokenizer: Any  # a transformers tokenizer (None before setup)
    train_records: list[dict[str, Any]] | None


class PolicyMixin:
    """The policy's source, LoRA / QLoRA settings, loading, optimizer and export info (see the module docstring)."""

    policy_settings: PolicySettings
    policy: nn.Module | None

    def _init_policy(self, model: str | nn.Module, settings: PolicySettings, optimizer: Any, lr_scheduler: Any) -> None:
        """Keep the settings; nothing is loaded before ``configure_model``."""
        from ..models.sources import resolve_model_source
        from ..models.tiny import BUILTIN_PREFIX, BUILTIN_VARIANTS, parse_builtin

        if model is None:
            raise ValueError(
                "model.model is required: a Hugging Face model folder or hub id, a checkpoint / run folder, an nn.Module, "
                f"or a built-in tiny model by name ({', '.join(BUILTIN_PREFIX + v for v in BUILTIN_VARIANTS)}; "
                "'tiny:chars' is the quickstart's)"
            )
        if not isinstance(model, (str, nn.Module)):
            raise TypeError(f"model.model must be a model name / folder or an nn.Module, got {type(model).__name__}")
        self.quantization = check_quantization(settings.quantization, settings.lora is not None, model)
        builtin = isinstance(model, str) and model.startswith(BUILTIN_PREFIX)
        #: "tiny:tools" / "tiny:tools@3": resolved by :attr:`model_source`
        self._builtin_model = model if builtin else None
        if builtin:
            parse_builtin(self._builtin_model, "model.model")  # a malformed name fails here, before any work
        # a packaged model, a GGUF file or a checkpoint / run folder (an SFT run): made a model folder once
        self._model_source = resolve_model_source(model) if isinstance(model, str) and not builtin else None
        self.policy = model if isinstance(model, nn.Module) else None
        # a transformers model given as an object remembers the folder or hub id it was loaded from
        # a transformers model (third-party)
        self._given_from = (getattr(model, "name_or_path", None) or None) if isinstance(model, nn.Module) else None
        self.optimizer_factory = optimizer
        self.lr_scheduler_factory = lr_scheduler

    @property
    def lora(self) -> LoraSettings | None:
        """The LoRA settings (``policy.lora``), None for full fine-tuning."""
        return self.policy_settings.lora

    @property
    def model_source(self) -> str | None:
        """The policy's model folder or hub id (None for an ``nn.Module``). A built-in tiny model's folder is that of
        the run's seed (:func:`~lightning_grpo.models.tiny.builtin_model_path`), resolved when read (LightningCLI's
        ``seed_everything`` comes before the module is built, a script's before ``fit``) and fixed once loaded."""
        if self._model_source is None and self._builtin_model is not None:
            from ..models.tiny import builtin_model_path

            return builtin_model_path(self._builtin_model)
        return self._model_source

    @model_source.setter
    def model_source(self, value: str | None) -> None:
        self._model_source = value

    @property
    def tokenizer_source(self) -> str | None:
        """Where the policy's own tokenizer is read from: its model folder or hub id (a built-in tiny model's
        folder holds its tokenizer); for a transformers model given as an object, the folder or hub id it was
        loaded from (``name_or_path``); None for any other ``nn.Module``."""
        return self.model_source if self.model_source is not None else self._given_from

    def _build_policy(self) -> None:
        """Load (or wrap) the policy once, enable gradient checkpointing, and put it in train mode."""
        if self.policy is None:
            self.policy = self._load_policy()
        elif self.lora is not None and not hasattr(self.policy, "disable_adapter"):  # a peft model (third-party)
            self.policy = apply_lora(self.policy, self.lora)
        # a transformers model (third-party)
        if self.policy_settings.gradient_checkpointing and hasattr(self.policy, "gradient_checkpointing_enable"):
            self.policy.gradient_checkpointing_enable()
        self.policy.train()  # from_pretrained returns eval mode and Lightning leaves it so

    @property
    def attached_trainer(self) -> Any:
        """The Trainer this module is attached to, or None (built, or used, outside a fit)."""
        try:
            return self.trainer
        except RuntimeError:  # Lightning: "... is not attached to a `Trainer`"
            return None

    def _load_policy(self) -> nn.Module:
        self._model_source = self.model_source  # the run seed's folder of a built-in model, fixed from now on
        trainer = self.attached_trainer
        device = trainer.strategy.root_device if trainer is not None else torch.device("cpu")
        return load_policy(self.model_source, self.policy_settings.dtype, self.lora, self.quantization, device)

    def precision_context(self):
        """The trainer's autocast context (training_step's), so no-grad forwards match the trained log-probs."""
        trainer = self.attached_trainer
        return trainer.precision_plugin.forward_context() if trainer is not None else nullcontext()

    def _save_export_info(self, checkpoint: dict[str, Any]) -> None:
        """Store what ``lightning-grpo export`` needs besides the weights (config, tokenizer files, LoRA)."""
        from ..models.export import EXPORT_KEY, export_info

        trainer = self.attached_trainer
        datamodule = trainer.datamodule if trainer is not None else None
        if self.policy is not None:  # a user's LightningDataModule holds no tokenizer of ours
            checkpoint[EXPORT_KEY] = export_info(
                self, datamodule.tokenizer if isinstance(datamodule, RunData) else None
            )

    def _load_quant_state(self, checkpoint: dict[str, Any]) -> None:
        if self.quantization is not None and self.policy is not None:  # QLoRA: the 4-bit state is rebuilt, not loaded
            take_quant_state(checkpoint["state_dict"], self)

    def _global_sum(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` summed over the ranks (float32, on this module's device)."""
        value = value.to(self.device, torch.float32)
        trainer = self.attached_trainer
        if trainer is not None and trainer.world_size > 1:
            value = trainer.strategy.reduce(value.clone(), reduce_op="sum")
        return value

    def configure_optimizers(self):
        params = [p for p in self.policy.parameters() if p.requires_grad]
        optimizer = self.optimizer_factory(params)
        if (message := rounded_away_warning(optimizer)) is not None:  # weights in 16 bits (bf16-true): rank 0 says it
            rank_zero_warn(message)
        if self.lr_scheduler_factory is None:
            return optimizer
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": self.lr_scheduler_factory(optimizer), "interval": "step"},
        }
