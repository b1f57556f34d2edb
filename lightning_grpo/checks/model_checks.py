"""Fit-time checks of the module's own settings: the model source, the reference, the loss, the LoRA settings, the
optimizer, and whether a tokenizer belongs to the policy (run by :meth:`lightning_grpo.plan.run_plan.RunPlan.resolve`
before any engine starts); their errors name the option as written in a recipe."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import torch

from ..models.lora import check_target_modules


def check_loss(module: Any) -> None:
    """``model.loss`` computes a loss on a made-up batch of 4 completions x 3 tokens (all inputs given)."""
    loss = module.loss_fn
    generator = torch.Generator().manual_seed(0)
    logp = -torch.rand(4, 3, generator=generator) - 0.1  # [B, T]
    mask = torch.ones(4, 3)  # [B, T]
    near = logp - 0.05 * torch.rand(4, 3, generator=generator)  # old / ref / rollout log-probs close to logp
    try:
        loss(
            logp.clone().requires_grad_(True),
            mask,
            torch.tensor([1.0, -1.0, 0.5, -0.5]),
            old_logp=near,
            ref_logp=near,
            rollout_logp=near,
            entropy=torch.full((4, 3), 0.5),
            num_tokens=torch.tensor(12.0),
            num_sequences=torch.tensor(4.0),
            turn_ids=torch.zeros(4, 3, dtype=torch.long),
        )
    except (ValueError, TypeError, KeyError) as err:
        raise ValueError(f"{_loss_field(loss, err)}: {err}") from err


def _loss_field(loss: Any, err: BaseException) -> str:
    """``model.loss.init_args.<field>`` of the part that raised ``err`` (its function called with
    a keyword it lacks, or raising inside; ``GRPOLoss.parts``), else ``model.loss``."""
    import traceback

    from ..core.objective import GRPOLoss

    if not isinstance(loss, GRPOLoss):
        return "model.loss"
    frames = {frame.name for frame in traceback.extract_tb(err.__traceback__)[1:]}
    for field, fn in loss.parts().items():
        name = fn.__name__
        if name in frames or str(err).startswith(f"{name}()"):
            return f"model.loss.init_args.{field}"
    return "model.loss"


def check_lora(module: Any) -> None:
    """``model.policy.lora``: ranges, the peft config, and target modules that exist in the architecture."""
    lora = module.lora
    if lora is None:
        return
    if not isinstance(lora.r, int) or lora.r < 1:
        raise ValueError(f"model.policy.lora.r must be an integer >= 1 (the adapter's rank), got {lora.r!r}")
    if not lora.alpha > 0:
        raise ValueError(f"model.policy.lora.alpha must be > 0 (delta_W = alpha / r * B A), got {lora.alpha!r}")
    if not 0 <= lora.dropout < 1:
        raise ValueError(f"model.policy.lora.dropout must be in [0, 1), got {lora.dropout!r}")
    try:
        config = lora.to_peft()
    except (TypeError, ValueError) as err:
        raise ValueError(f"model.policy.lora (its extra settings go to peft's LoraConfig): {err}") from err
    skeleton = _meta_policy(module)
    if skeleton is None:
        return
    from peft import get_peft_model

    check_target_modules(skeleton, lora)
    try:
        get_peft_model(skeleton, config)
    except (ValueError, TypeError, KeyError) as err:
        raise ValueError(f"model.policy.lora.target_modules {lora.target_modules!r} (or extra): {err}") from err


def _meta_policy(module: Any) -> Any:
    """The policy's architecture without weights (``meta`` device), from its config.json; None when
    the policy is a built module or a hub id not on disk."""
    if module.policy is not None:
        return None
    config = model_config(module)
    if config is None:
        return None
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(Path(module.model_source).expanduser()))


def model_config(module: Any) -> dict[str, Any] | None:
    """The policy's config.json as a dict when it is on disk (None for a hub id or a built module)."""
    source = module.model_source  # None: the policy was given as a built module
    if not isinstance(source, str):
        return None
    file = Path(source).expanduser() / "config.json"
    if not file.is_file():
        return None
    config = json.loads(file.read_text())
    return {**config.get("text_config", {}), **config}


def tokenizer_mismatch(tokens: int, eos: int | None, rows: int, policy_eos: set[int] | None) -> str | None:
    """Why a tokenizer of ``tokens`` tokens ending with ``eos`` is not the policy's (``rows`` embedding rows, EOS ids
    ``policy_eos``; None: the policy's own tokenizer, only the row count is checked), or None. A model's embedding
    may have a few spare rows (Qwen2.5: 271), never half of them."""
    if tokens > rows:
        return f"it has {tokens} tokens, the policy's embedding {rows} rows"
    if policy_eos is None:
        return None
    if tokens < rows // 2:
        return f"it has {tokens} tokens, the policy's embedding {rows} rows (another vocabulary)"
    if policy_eos and eos not in policy_eos:
        return f"its EOS token id is {eos}, the policy's {sorted(policy_eos)}"
    return None


def policy_eos_ids(module: Any) -> set[int]:
    """The EOS token ids the policy's config.json and generation_config.json state (empty when not on disk)."""
    source = module.model_source
    ids: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        file = Path(source).expanduser() / name if isinstance(source, str) else None
        if file is not None and file.is_file():
            value = json.loads(file.read_text()).get("eos_token_id")
            ids.update(value if isinstance(value, list) else [] if value is None else [value])
    return ids


def check_reference(module: Any) -> None:
    """A KL penalty needs a reference model."""
    if module.policy_settings.reference != "none":
        return
    beta = module.loss_fn.beta
    if beta:
        raise ValueError(
            f"model.loss.init_args.kl.beta={beta} puts a KL to the reference model in the loss, but "
            "model.policy.reference='none': set model.policy.reference: auto (or kl.beta: 0)"
        )
    coef = module.algorithm.kl_in_reward.coef
    if coef:
        raise ValueError(
            f"model.algorithm.kl_in_reward.coef={coef} subtracts a KL to the reference model from the rewards, but "
            "model.policy.reference='none': set model.policy.reference: auto (or model.algorithm.kl_in_reward.coef: 0)"
        )


def check_model_source(module: Any) -> None:
    """A model path exists and holds config.json; a hub id is in the local cache or on the hub (which
    answers within seconds: :func:`~lightning_grpo.checks.preflight.hub_model_problem`). The error says
    which of the two the name was taken for (:func:`~lightning_grpo.models.hub.is_local_path`, the one rule)."""
    source = module.model_source
    if not isinstance(source, str):
        return
    from ..models.hub import is_local_path
    from ..models.sources import local_source_problem
    from .preflight import hub_model_problem

    if (problem := local_source_problem(source)) is not None:
        raise FileNotFoundError(f"model.model: {problem}")
    if Path(source).expanduser().is_dir() or is_local_path(source):
        return
    if (problem := hub_model_problem(source)) is not None:
        raise FileNotFoundError(
            f"model.model: {source} was taken for a hub id (no such local folder) and {problem}; "
            "expected a Hugging Face model directory or a hub id that is cached or reachable"
        )


def check_optimizer(module: Any) -> None:
    """``model.optimizer`` accepts its arguments and has a learning rate > 0 (probed on one tensor)."""
    factory = module.optimizer_factory
    if factory is None:
        return
    name = _callable_name(factory)
    try:
        optimizer = factory([torch.nn.Parameter(torch.zeros(1))])
    except ValueError as err:  # torch.optim validates lr, betas, eps, weight_decay this way
        raise ValueError(f"model.optimizer: {name} rejected its arguments: {err}") from err
    except Exception:  # noqa: BLE001 - e.g. an optimizer that needs GPU tensors: the real call reports it
        return
    for group in getattr(optimizer, "param_groups", []):
        lr = group.get("lr")
        if isinstance(lr, (int, float, torch.Tensor)) and not float(lr) > 0:
            raise ValueError(
                f"model.optimizer: the learning rate must be > 0 (0 never changes the policy), got {float(lr)}"
            )


def _callable_name(factory: Any) -> str:
    """``AdamW`` for the class, a partial of it, or LightningCLI's partial around it."""
    target = factory
    if isinstance(factory, functools.partial):
        target = next((a for a in factory.args if isinstance(a, type)), factory.func)
    name = getattr(target, "__name__", "")
    return name if name.isidentifier() else "the optimizer"  # not "<lambda>"
