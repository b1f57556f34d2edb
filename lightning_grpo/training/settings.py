"""The grouped settings of `GRPOModule` and `SFTModule`.

A recipe writes them as sections of ``model:``::

    model:
      model: Qwen/Qwen2.5-0.5B-Instruct
      algorithm: {advantage: grpo, num_iterations: 1, steps_per_generation: 1,
                  kl_in_reward: {coef: 0.0, controller: fixed}}
      policy: {dtype: bfloat16, lora: {r: 16, alpha: 32}, gradient_checkpointing: true, reference: auto}
      forward: {logprob_path: chunked_hidden, chunk_size: 1024, packing: auto, rows_per_pass: 64}

Each settings class checks its own values when built and names the bad field as a recipe writes it
(``model.forward.rows_per_pass``). LightningCLI builds them from the YAML; the Python API takes
instances (a plain dict is accepted too: a checkpoint's hyper-parameters store them as dicts).
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from ..core import ADVANTAGES, KL_CONTROLLERS, LOGPROBS, REWARD_AGGREGATIONS
from ..models.lora import LoraSettings
from ..models.quantization import QuantizationSettings

__all__ = [
    "AlgorithmSettings",
    "ForwardSettings",
    "KLInRewardSettings",
    "PolicySettings",
    "as_settings",
    "settings_dict",
]

MODES = ("auto", "on", "off")


@dataclass
class KLInRewardSettings:
    """The KL to the reference moved into the reward, ``r - coef * sum_t k1_t`` (verl ``use_kl_in_reward`` with
    ``algorithm.kl_ctrl``): the KL reaches the policy through the advantage."""

    coef: float = 0.0
    """The coefficient (the adaptive controller's initial value); 0 turns KL in reward off."""
    controller: Literal["fixed", "adaptive"] = "fixed"
    """``fixed``: ``coef`` throughout. ``adaptive`` (Ziegler et al. 2019, verl ``AdaptiveKLController``): after each
    generation batch, ``coef *= 1 + clip(kl / target - 1, -0.2, 0.2) * rows / horizon`` with ``kl`` the batch's mean
    per-sequence token-mean k1 and ``rows`` its completions (all ranks)."""
    target: float = 0.1
    """``adaptive``: the KL (per token) to steer toward (verl ``kl_ctrl.target_kl``)."""
    horizon: int = 10000
    """``adaptive``: the completions over which a full 20% correction builds up (verl ``kl_ctrl.horizon``)."""

    def __post_init__(self) -> None:
        where = "model.algorithm.kl_in_reward"
        KL_CONTROLLERS.get(self.controller)  # an unknown name lists the valid ones
        if not self.coef >= 0:
            raise ValueError(f"{where}.coef must be >= 0, got {self.coef!r}")
        if self.controller == "adaptive" and self.coef == 0:
            raise ValueError(f"{where}.controller 'adaptive' scales the coefficient: {where}.coef must be > 0, got 0")
        if not self.target > 0:
            raise ValueError(f"{where}.target must be > 0, got {self.target!r}")
        if not (isinstance(self.horizon, int) and self.horizon > 0):
            raise ValueError(f"{where}.horizon must be an integer > 0, got {self.horizon!r}")

    def build(self) -> Any:
        """The ``KL_CONTROLLERS`` controller these settings describe (``value`` is the coefficient in use)."""
        if self.controller == "adaptive":
            return KL_CONTROLLERS.get("adaptive")(kl_coef=self.coef, target_kl=self.target, horizon=self.horizon)
        return KL_CONTROLLERS.get("fixed")(kl_coef=self.coef)


@dataclass
class AlgorithmSettings:
    """What the module computes from a generation batch: advantages, KL in reward, and how often it trains on it.

    Example:
        ```python
        from lightning_grpo import AlgorithmSettings, GRPOModule

        module = GRPOModule(
            model="tiny:chars", algorithm=AlgorithmSettings(advantage="dr_grpo", steps_per_generation=4)
        )
        ```
    """

    advantage: str = "grpo"
    """Advantage estimator by name (``ADVANTAGES``: grpo, dr_grpo, rloo, qae, ...)."""
    advantage_args: dict[str, Any] | None = None
    """Its keyword arguments (e.g. ``{eps: 1.0e-4}``)."""
    reward_aggregation: str = "sum_then_normalize"
    """How several reward functions combine (``REWARD_AGGREGATIONS``)."""
    unscored: Literal["exclude", "zero"] = "exclude"
    """A sample that no reward function scores (every one returned ``None``): ``exclude`` leaves it out of
    its group's mean and std and gives it advantage 0, a group with fewer than 2 scored samples gets 0
    throughout (TRL); ``zero`` scores it 0 and keeps it in the group's statistics. Either way it stays in
    the loss's token count and KL term."""
    kl_in_reward: KLInRewardSettings = field(default_factory=KLInRewardSettings)
    """Subtract a KL to the reference from each reward (needs a reference; ``coef: 0`` is off)."""
    num_iterations: int = 1
    """Passes over each generation batch (PPO epochs)."""
    steps_per_generation: int = 1
    """Optimizer steps (mini-batches) per pass."""

    def __post_init__(self) -> None:
        self.kl_in_reward = as_settings(KLInRewardSettings, self.kl_in_reward)
        for name, registry in (("advantage", ADVANTAGES), ("reward_aggregation", REWARD_AGGREGATIONS)):
            if getattr(self, name) not in registry:
                raise ValueError(
                    f"model.algorithm.{name}: unknown {registry.kind} {getattr(self, name)!r}; valid names: {', '.join(registry.names())}"
                )
        for name in ("num_iterations", "steps_per_generation"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"model.algorithm.{name} must be an integer >= 1, got {value!r}")
        if self.unscored not in ("exclude", "zero"):
            raise ValueError(f"model.algorithm.unscored must be 'exclude' or 'zero', got {self.unscored!r}")


@dataclass
class SFTPolicySettings:
    """How the policy is loaded and trained by `SFTModule` (GRPO's `PolicySettings` adds its reference).

    Example:
        ```python
        from lightning_grpo import LoraSettings, SFTModule, SFTPolicySettings

        module = SFTModule(model="Qwen/Qwen2.5-0.5B-Instruct", policy=SFTPolicySettings(lora=LoraSettings(r=16)))
        ```
    """

    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """The dtype to load a model path in."""
    lora: LoraSettings | None = None
    """LoRA settings, or None for full fine-tuning."""
    quantization: QuantizationSettings | None = None
    """QLoRA: the base model's linear layers in 4 bits (bitsandbytes nf4 / fp4; needs ``lora`` and a model path).
    Engines get the dequantised weights."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward (saves memory)."""

    def __post_init__(self) -> None:
        if isinstance(self.lora, dict):
            self.lora = LoraSettings(**self.lora)
        if isinstance(self.quantization, dict):
            self.quantization = QuantizationSettings(**self.quantization)
        _check_choice("model.policy.dtype", self.dtype, ("float32", "bfloat16", "float16"))


@dataclass
class PolicySettings(SFTPolicySettings):
    """How the policy (and its reference) is loaded and trained: `SFTPolicySettings`' fields and ``reference``.

    Example:
        ```python
        from lightning_grpo import GRPOModule, LoraSettings, PolicySettings, QuantizationSettings

        policy = PolicySettings(
            dtype="bfloat16",
            lora=LoraSettings(r=16, alpha=32),
            quantization=QuantizationSettings(quant_type="nf4"),  # QLoRA: the `qlora` extra
            gradient_checkpointing=True,
        )
        module = GRPOModule(model="Qwen/Qwen2.5-7B-Instruct", policy=policy)
        ```
    """

    reference: Literal["auto", "none", "copy", "adapter"] = "auto"
    """The reference model: ``auto`` (none when no KL is used, the adapter-disabled model with LoRA, a frozen copy
    otherwise), or force ``none`` / ``copy`` / ``adapter``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_choice("model.policy.reference", self.reference, ("auto", "none", "copy", "adapter"))
        if self.reference == "adapter" and self.lora is None:
            raise ValueError(
                "model.policy.reference 'adapter' needs model.policy.lora (the reference is the model without its adapter)"
            )


@dataclass
class SFTForwardSettings:
    """The layout of `SFTModule`'s forward (docs/evidence/performance.md): same numbers, other costs. GRPO's
    `ForwardSettings` adds prompt sharing and the no-grad passes."""

    logprob_path: Literal["chunked_hidden", "logits"] = "chunked_hidden"
    """``LOGPROBS`` entry: ``chunked_hidden`` (decoder, then the LM head in chunks: the full logits never exist; run as
    a root forward under FSDP2) or ``logits`` (the model's own forward, completion logits only; for DeepSpeed ZeRO-3).
    Models without a decoder / LM head use ``logits``."""
    chunk_size: int = 1024
    """``chunked_hidden``: rows of the LM head computed at once (memory vs speed)."""
    save_probs: bool = False
    """``chunked_hidden``: keep the softmax of the scored tokens ([N, V] float32) for backward instead of recomputing
    their logits there: faster, N * V * 4 bytes more memory. Same numbers; for small models / batches."""
    packing: Literal["auto", "on", "off"] = "auto"
    """Padding-free packed rows (``lightning_grpo.training.packing``): ``auto`` when the model supports it and it saves
    at least a quarter; ``on`` / ``off`` force it."""

    def __post_init__(self) -> None:
        if self.logprob_path not in LOGPROBS:
            raise ValueError(
                f"model.forward.logprob_path: unknown {LOGPROBS.kind} {self.logprob_path!r}; valid names: {', '.join(LOGPROBS.names())}"
            )
        _check_choice("model.forward.packing", self.packing, MODES)
        if not (isinstance(self.chunk_size, int) and self.chunk_size >= 1):
            raise ValueError(f"model.forward.chunk_size must be an integer >= 1, got {self.chunk_size!r}")


@dataclass
class ForwardSettings(SFTForwardSettings):
    """The layout of the policy, reference, old and teacher forwards (docs/evidence/performance.md): same numbers,
    other costs. `SFTForwardSettings`' fields, ``prefix_sharing`` and ``rows_per_pass``."""

    prefix_sharing: Literal["auto", "on", "off"] = "auto"
    """Each prompt computed once per micro-batch, its keys / values shared by its group's completions
    (``lightning_grpo.training.prefix``, sdpa / eager attention); ``auto`` / ``on`` / ``off`` as ``packing``."""
    rows_per_pass: int = 64
    """Rows per no-grad forward (reference, old and teacher log-probs)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_choice("model.forward.prefix_sharing", self.prefix_sharing, MODES)
        if not (isinstance(self.rows_per_pass, int) and self.rows_per_pass >= 1):
            raise ValueError(f"model.forward.rows_per_pass must be an integer >= 1, got {self.rows_per_pass!r}")


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}, got {value!r}")


def as_settings(cls: type, value: Any) -> Any:
    """``value`` as a ``cls`` instance: an instance as is, a dict (hyper-parameters, a checkpoint) built into one;
    anything else is one error naming the class."""
    if type(value) is cls:  # exactly: GRPO's settings (a subclass) carry fields SFT does not take
        return copy.deepcopy(value)  # a default instance in a signature is shared: each module gets its own
    if isinstance(value, dict):
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - names)
        if unknown:
            raise ValueError(
                f"{cls.__name__}: unknown field(s) {', '.join(unknown)}; valid: {', '.join(sorted(names))}"
            )
        return cls(**value)
    raise TypeError(f"expected {cls.__name__} (or a dict of its fields), got {type(value).__name__}")


def settings_dict(settings: Any) -> dict[str, Any]:
    """The settings as a plain dict (nested settings too): what ``save_hyperparameters`` stores, so a checkpoint
    holds no pickled classes and ``hparams.yaml`` stays readable."""
    return asdict(settings)
