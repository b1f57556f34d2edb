"""Cross-checks of a run's configuration, made before anything trains or is written.

:func:`check_fit_config` looks at the Trainer, the :class:`~lightning_grpo.GRPOModule`, the
:class:`~lightning_grpo.data.datamodule.PromptDataModule` and the
:class:`~lightning_grpo.RolloutCallback` together, which no constructor can. ``lightning-grpo fit``
runs it from the CLI's ``before_fit`` hook (before ``trainer.fit``, so before Lightning's loggers
create their run directory; :mod:`lightning_grpo.cli`), and ``RolloutCallback.setup`` runs it again
on every rank (also for drop-in use without the CLI). Each problem is one exception whose message
names the option as written in a recipe (``data.batch_size``, ``model.algorithm.advantage``,
``rollout.sampling.n``, ...) and what was expected. It checks:

* the engine (``rollout.engine``, the settings' own ``check``): vLLM installed for the in-process engine; on
  CPU a prefill budget (``max_num_batched_tokens``) of at least ``max_model_len`` and no chunked prefill
  (``rollout/prefill.py``); ``weight_sync.lora: adapter`` with an engine that serves adapters (vllm, with
  ``enable_lora``) and ``model.policy.lora``; ``sleep_level: 2`` only with ``weight_sync.enabled``;
  ``max_staleness >= 1`` only with a loss that corrects for the behaviour policy;
* the layout: no ``model.policy.quantization`` (QLoRA) and no ``engine: hf`` with ``trainer.strategy``
  ModelParallelStrategy (FSDP2);
* the groups: at least 2 completions per prompt for a group-relative advantage (all built-in
  ones); no more training steps per generation batch than it has completions;
* the reference: ``kl.beta > 0`` or ``algorithm.kl_in_reward.coef`` with ``policy.reference: none``;
* lengths: the engine's ``max_model_len`` (``rollout.engine.init_args``) is derived when not set
  (``data.format.max_prompt_length``, else the longest prompt of the data, + ``sampling.max_new_tokens``,
  handed to the callback); a set one, or the policy's ``max_position_embeddings`` for ``hf``, must hold it;
* the model: a local ``model.model`` directory holds ``config.json``; the tokenizer's vocabulary
  fits the policy's embedding;
* the loss: ``model.loss`` runs on a small made-up batch (negative ``eps_high``, an unknown
  keyword of the policy loss or aggregation, ... fail here, not after the engine started);
* LoRA: ``model.policy.lora`` rank, alpha and dropout in range, its peft config valid, and its
  ``target_modules`` present in the policy's architecture (matched on an empty ``meta`` copy);
* the optimizer: it accepts its arguments and its learning rate is > 0;
* pre-flight (:mod:`lightning_grpo.checks.preflight`): every server the run talks to (vLLM servers,
  environment servers, judges) accepts a connection, and every teacher folder exists;
* the chat template (a warning, :mod:`lightning_grpo.checks.chat_template`): multi-turn episodes rendered
  message by message keep every earlier turn as it was rendered;
* the rewards: every reward function runs on stand-in completions of the first training rows
  (:mod:`lightning_grpo.data.reward_probe`).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import torch

from ..core import ADVANTAGES, AdvantageSpec
from .chat_template import check_chat_template
from .model_checks import check_lora, check_loss, model_config, policy_eos_ids, tokenizer_mismatch
from .preflight import check_external

CB = "rollout"


def check_fit_config(
    trainer: Any, module: Any, callback: Any, datamodule: Any = None, recipes: Sequence[Any] = ()
) -> None:
    """Raise on the first inconsistent or out-of-range option of the run (see the module docstring).

    ``datamodule``: the run's data module, when the trainer does not hold it yet (before
    ``trainer.fit``); a data module that is not set up yet is set up here for the data checks.
    ``recipes``: the run's config files (their headers may name the command that makes a teacher).
    """
    dm = datamodule if datamodule is not None else getattr(trainer, "datamodule", None)
    check_engine(module, callback)
    check_layout(trainer, module, callback)
    check_groups(trainer, module, callback, dm)
    check_reference(module)
    check_model_source(module)
    check_loss(module)
    check_lora(module)
    check_optimizer(module)
    check_external(module, callback, recipes)
    if dm is not None and hasattr(dm, "train_records"):
        if dm.train_records is None:
            dm.setup("fit")
        check_chat_template(dm, callback)
        check_lengths(dm, module, callback)
        check_vocabulary(dm, module)
        check_rewards(dm, callback)
    check_prefill(callback)


def check_rewards(dm: Any, callback: Any) -> None:
    """Every reward function runs on stand-in completions of real rows (:meth:`RolloutCallback.probe_rewards`)."""
    if getattr(dm, "tokenizer", None) is None:
        return
    callback.probe_rewards(dm.train_records, dm.tokenizer)


def check_async_loss(max_staleness: int, loss: Any) -> None:
    """Asynchronous batches are sampled by older weights: the loss must correct for the behaviour policy."""
    if max_staleness > 0 and loss is not None and not loss.needs_rollout_logprobs:
        raise ValueError(
            f"rollout.max_staleness={max_staleness} trains on batches sampled by older weights, but the loss has no "
            "off-policy correction: set model.loss.init_args.off_policy.correction (e.g. tis_token)"
        )


# ------------------------------------------------------------------------------------ engine
def check_engine(module: Any, callback: Any) -> None:
    """vLLM installed where the engine runs it, the engine settings against the weight sync, the LoRA sync mode
    and the staleness's correction."""
    settings = callback.engine_settings
    if callback.engine is None and settings.runs_vllm_here and not _vllm_installed():
        from ..rollout.vllm import MISSING_VLLM

        raise ImportError(f"{MISSING_VLLM}; or set {CB}.engine: hf (transformers generate, no vLLM)")
    if callback.engine is None:
        settings.check(weight_sync_enabled=callback.weight_sync.enabled, max_model_len=None)
    _check_lora_sync(module, callback)
    check_async_loss(callback.max_staleness, module.loss_fn)


def check_prefill(callback: Any) -> None:
    """The engine settings against the context length derived from the data (on CPU the engine prefills every
    prompt whole: its budget must hold ``max_model_len``, :mod:`~lightning_grpo.rollout.prefill`)."""
    if callback.engine is not None:
        return
    enabled = callback.weight_sync.enabled
    callback.engine_settings.check(weight_sync_enabled=enabled, max_model_len=callback.context_length)


def _vllm_installed() -> bool:
    if "vllm" in sys.modules:  # None there means an import of it was blocked
        return sys.modules["vllm"] is not None
    return find_spec("vllm") is not None


def _check_lora_sync(module: Any, callback: Any) -> None:
    if callback.weight_sync.lora != "adapter":
        return
    settings = callback.engine_settings
    if not settings.serves_lora_adapters:
        raise ValueError(
            f"{CB}.weight_sync.lora='adapter' hands the LoRA adapter to vLLM, but {CB}.engine is "
            f"{settings.name!r}, which takes merged weights only: use weight_sync.lora: merged or engine: vllm"
        )
    if module.lora is None:
        raise ValueError(f"{CB}.weight_sync.lora='adapter' needs a LoRA policy, but model.policy.lora is not set")
    settings.check_lora_adapter()


# ------------------------------------------------------------------------------------ layout
def check_layout(trainer: Any, module: Any, callback: Any = None) -> None:
    """Options the process layout cannot combine with (before the launcher starts the ranks)."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    if not isinstance(getattr(trainer, "strategy", None), ModelParallelStrategy):
        return
    if module.quantization is not None:
        raise ValueError(
            "model.policy.quantization (QLoRA) does not shard with trainer.strategy ModelParallelStrategy (FSDP2): "
            "use strategy ddp or one device, or train without model.policy.quantization"
        )
    if callback is not None and callback.engine is None and callback.engine_settings.samples_live_policy:
        raise ValueError(
            f"{CB}.engine {callback.engine_settings.name!r} generates with the live policy, which trainer.strategy ModelParallelStrategy (FSDP2) "
            "shards (its forward fails on the sharded weights): use engine vllm or vllm_server (they get the gathered "
            "weights), or strategy ddp"
        )


# ------------------------------------------------------------------------------------ groups
def check_groups(trainer: Any, module: Any, callback: Any, dm: Any = None) -> None:
    """G >= 2 for group-relative advantages; every training step of a generation gets rows."""
    advantage = module.algorithm.advantage
    keep = callback.selector.keep
    field = f"{CB}.selection.gfpo_keep" if keep is not None else f"{CB}.sampling.n"
    group = callback.selector.out_group_size
    spec = ADVANTAGES.spec(advantage) if advantage in ADVANTAGES else AdvantageSpec()  # unknown: named elsewhere
    if group < 2 and spec.group_relative:
        how = "normalised by their reward std" if spec.divides_by_group_std else "so every advantage would be 0"
        raise ValueError(
            f"{field}={group} leaves 1 completion per prompt, but model.algorithm.advantage={advantage!r} compares each "
            f"completion with the others of its prompt ({how}): set {field} >= 2"
        )
    dm = dm if dm is not None else getattr(trainer, "datamodule", None)
    if dm is None or not hasattr(dm, "batch_size"):
        return
    rows = dm.batch_size * group  # completions per rank and generation
    steps = module.algorithm.steps_per_generation
    accumulate = getattr(trainer, "accumulate_grad_batches", 1)
    if steps * accumulate > rows:
        raise ValueError(
            f"model.algorithm.steps_per_generation={steps} x trainer.accumulate_grad_batches={accumulate} training steps "
            f"share each generation batch of data.batch_size={dm.batch_size} x {field}={group} = {rows} "
            f"completions: some steps would get none; make their product <= {rows}"
        )


# --------------------------------------------------------------------------------- reference
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


# ------------------------------------------------------------------------------------- model
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


def check_vocabulary(dm: Any, module: Any) -> None:
    """The data's tokenizer belongs to the policy: every token id has a row in the policy's embedding, and a
    tokenizer read from elsewhere than the policy's folder (``data.tokenizer_path``) also fills most of the
    embedding (a smaller one is another vocabulary) and ends with the policy's EOS token (`tokenizer_mismatch`)."""
    tokenizer = getattr(dm, "tokenizer", None)
    if tokenizer is None:
        return
    config = model_config(module) or {}
    policy = module.policy
    if policy is not None and hasattr(policy, "get_input_embeddings"):
        rows, where = policy.get_input_embeddings().num_embeddings, module.model_source or type(policy).__name__
    elif isinstance(config.get("vocab_size"), int):
        rows, where = config["vocab_size"], module.model_source
    else:
        return
    source = dm.tokenizer_source or type(tokenizer).__name__
    own = dm.tokenizer_source is not None and dm.tokenizer_source == module.tokenizer_source
    problem = tokenizer_mismatch(len(tokenizer), tokenizer.eos_token_id, rows, None if own else policy_eos_ids(module))
    if problem is not None:
        raise ValueError(
            f"data.tokenizer_path ({source}) does not belong to the policy ({where}): {problem}; leave "
            "data.tokenizer_path unset to use the policy's own tokenizer, or set it to the policy's folder"
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


# ----------------------------------------------------------------------------------- lengths
def check_lengths(dm: Any, module: Any, callback: Any) -> None:
    """The engine's ``max_model_len``: derived from the data when not set (handed to the callback); a set one
    (or the policy's ``max_position_embeddings`` for ``hf``) must hold the longest prompt + ``max_new_tokens``."""
    records = [*(dm.train_records or []), *(dm.val_records or []), *(dm.test_records or [])]
    if not records:
        return
    prompt = dm.max_prompt_length or max(len(r["prompt_ids"]) for r in records)  # the bound a refreshed source keeps
    what = "data.format.max_prompt_length" if dm.max_prompt_length else "the longest prompt"
    limit, limit_field = _engine_max_length(module, callback)
    if limit is None:
        if callback.engine is not None or callback.engine_settings.samples_live_policy:
            return
        budget, budget_field = callback.completion_budget()
        if budget is None:
            raise ValueError(
                f"{limit_field} is not set, and {budget_field} does not bound an episode's tokens: set one of them"
            )
        callback.use_context_length(prompt + budget)
        return
    new = callback.sampling.max_new_tokens
    if prompt + new > limit:
        raise ValueError(
            f"{limit_field}={limit} is smaller than {what} ({prompt} tokens) + "
            f"{CB}.sampling.max_new_tokens ({new}) = {prompt + new}"
        )


def _engine_max_length(module: Any, callback: Any) -> tuple[int | None, str]:
    """(longest prompt + completion the engine takes as set (None: derived), the option that sets it)."""
    if callback.engine is not None:  # an engine given with use_engine()
        return callback.engine.max_model_len, "the engine's max_model_len"
    settings = callback.engine_settings
    if not settings.samples_live_policy:
        return settings.context_limit()
    policy = module.policy
    config = getattr(policy, "config", None)
    positions = getattr(config, "max_position_embeddings", None)
    if positions is None:
        positions = (model_config(module) or {}).get("max_position_embeddings")
    return positions, f"the policy's max_position_embeddings (engine {settings.name!r})"
