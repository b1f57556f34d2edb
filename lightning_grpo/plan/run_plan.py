"""RunPlan: what a run derives from its settings, resolved once, before any engine starts.

The module (``model``), the data (``data``), the rollout (``rollout``) and the Trainer each own their settings;
what follows from several of them together has one home here:

* the **context length**: the longest prompt + completion one engine sequence holds (`context_length`);
* the **batch geometry**: how a generation batch becomes optimizer and training steps
  (:class:`~lightning_grpo.core.batch.BatchGeometry`, built once with its limits checked: `batch_geometry`);
* the **seeds**: the run seed (``seed_everything``; :func:`~lightning_grpo.models.tiny.run_seed`) and the
  sampling seed (``rollout.seed`` when set, else the run seed). The data's prompt order (``data.seed`` when set)
  and the built-in tiny model's initialisation (``tiny:<variant>@<seed>`` when pinned) follow the same run seed;
* the **tokenizer source**: the data's tokenizer, the policy's own unless ``data.tokenizer_path`` names another;
* the **engine settings**: ``rollout.engine`` as set (a typed
  :class:`~lightning_grpo.rollout.engine_settings.EngineSettings`), which the rollout callback builds its engine
  from with the context length (``build(..., max_model_len=context_length)``); not used for an engine handed over
  with ``use_engine``.

:meth:`RunPlan.resolve` builds it and checks, in this order: the engine (:mod:`.engine_rules`), the layout, the
groups and the geometry's limits, the reference, the model, the loss, LoRA, the optimizer
(:mod:`~lightning_grpo.checks.model_checks`), the servers and teachers (:mod:`~lightning_grpo.checks.preflight`),
the chat template (a warning), the lengths, the vocabulary, the rewards (every reward function on stand-in
completions of the first training rows) and the engine settings against the context length (the prefill budget).
Each problem is one exception whose message names the option as written in a recipe. ``lightning-grpo fit``
resolves the plan before ``trainer.fit`` (before the loggers create their run directory) and hands it to the
rollout callback; a rollout callback used without the command line resolves it in its ``setup``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import lightning as L

from ..checks.chat_template import check_chat_template
from ..checks.model_checks import (
    check_lora,
    check_loss,
    check_model_source,
    check_optimizer,
    check_reference,
    model_config,
    policy_eos_ids,
    tokenizer_mismatch,
)
from ..checks.preflight import check_external
from ..core import ADVANTAGES, AdvantageSpec
from ..core.batch import BatchGeometry
from ..data.datamodule import PromptDataModule
from ..models.tiny import run_seed
from ..rollout.engine_settings import EngineSettings
from ..training.module import GRPOModule
from .engine_rules import CB, check_engine, check_layout, check_prefill
from .rollout_side import RolloutSide


@dataclass(frozen=True)
class RunPlan:
    """What a run derives from its settings (see the module docstring); built by :meth:`resolve`, read by the
    rollout callback, which hands the geometry to the data and the module."""

    context_length: int | None
    """The longest prompt + completion one engine sequence holds, by one rule: the engine's ``max_model_len`` when
    set (``rollout.engine.init_args.max_model_len``, or an engine handed over with ``use_engine``), which must hold
    the prompt bound + ``rollout.sampling.max_new_tokens``; else the prompt bound + the rollout's completion budget
    (``sampling.max_new_tokens``; episodes: ``max_episode_tokens`` + ``max_new_tokens``). The prompt bound is
    ``data.format.max_prompt_length``, else the longest tokenized prompt of the train, validation and test splits.
    None for an engine on the live policy (``hf``, whose ``max_position_embeddings`` must hold the same sum) and for
    a handed-over engine without a ``max_model_len``."""
    geometry: BatchGeometry
    """The run's batch geometry (``data.batch_size`` x group size per rank and generation)."""
    seed: int
    """The run seed: ``seed_everything``'s, else 0."""
    sampling_seed: int
    """The seed every rank's and generation's sampling seed is derived from: ``rollout.seed``, else `seed`."""
    tokenizer_source: str | None
    """Where the data's tokenizer was read: ``data.tokenizer_path``, else the policy's folder or hub id."""
    engine_settings: EngineSettings
    """``rollout.engine`` as set: the typed settings the rollout callback builds its engine from, with
    ``max_model_len=context_length`` (used where the settings leave their own unset)."""

    @classmethod
    def resolve(
        cls,
        trainer: L.Trainer,
        module: GRPOModule,
        data: PromptDataModule,
        rollout: RolloutSide,
        recipes: Sequence[str] = (),
    ) -> RunPlan:
        """Check the run and derive its plan (sets the data up when it is not yet). ``recipes``: the run's config
        files (their headers may name the command that makes a missing teacher folder)."""
        check_engine(module, rollout)
        check_layout(trainer, module, rollout)
        geometry = batch_geometry(trainer, module, data, rollout)
        check_reference(module)
        check_model_source(module)
        check_loss(module)
        check_lora(module)
        check_optimizer(module)
        check_external(module, rollout.servers, recipes)
        if data.train_records is None:
            data.setup("fit")
        check_chat_template(data, rollout.conversations)
        length = context_length(module, data, rollout)
        check_vocabulary(data, module)
        if data.tokenizer is not None:
            rollout.probe_rewards(data.train_records, data.tokenizer)
        check_prefill(rollout, length)
        seed = run_seed()
        return cls(
            context_length=length,
            geometry=geometry,
            seed=seed,
            sampling_seed=seed if rollout.seed is None else rollout.seed,
            tokenizer_source=data.tokenizer_source,
            engine_settings=rollout.engine_settings,
        )


def batch_geometry(
    trainer: L.Trainer, module: GRPOModule, data: PromptDataModule, rollout: RolloutSide
) -> BatchGeometry:
    """The run's batch geometry, with its limits: G >= 2 for a group-relative advantage (all built-in ones), and
    no more training steps per generation batch than it has completions."""
    advantage = module.algorithm.advantage
    field, group = rollout.group_field, rollout.group_size
    spec = ADVANTAGES.spec(advantage) if advantage in ADVANTAGES else AdvantageSpec()  # unknown: named elsewhere
    if group < 2 and spec.group_relative:
        how = "normalised by their reward std" if spec.divides_by_group_std else "so every advantage would be 0"
        raise ValueError(
            f"{field}={group} leaves 1 completion per prompt, but model.algorithm.advantage={advantage!r} compares each "
            f"completion with the others of its prompt ({how}): set {field} >= 2"
        )
    rows = data.batch_size * group  # completions per rank and generation
    steps = module.algorithm.steps_per_generation
    accumulate = trainer.accumulate_grad_batches
    if steps * accumulate > rows:
        raise ValueError(
            f"model.algorithm.steps_per_generation={steps} x trainer.accumulate_grad_batches={accumulate} training steps "
            f"share each generation batch of data.batch_size={data.batch_size} x {field}={group} = {rows} "
            f"completions: some steps would get none; make their product <= {rows}"
        )
    return BatchGeometry(
        prompts=data.batch_size,
        group_size=group,
        num_iterations=module.algorithm.num_iterations,
        steps_per_generation=steps,
        accumulate=accumulate,
    )


def context_length(module: GRPOModule, data: PromptDataModule, rollout: RolloutSide) -> int | None:
    """The run's context length (the rule: `RunPlan.context_length`); raises when a set limit is too small, or
    when none is set and the rollout's completion budget is unbounded. Needs the data set up."""
    records = [*data.train_records, *data.val_records, *data.test_records]
    prompt = data.max_prompt_length or max(len(r["prompt_ids"]) for r in records)  # the bound a refreshed source keeps
    live_policy = rollout.engine is None and rollout.engine_settings.samples_live_policy
    limit, limit_field = _engine_limit(module, rollout)
    if limit is None:
        if rollout.engine is not None or live_policy:
            return None
        if rollout.completion_budget is None:
            raise ValueError(
                f"{limit_field} is not set, and {rollout.budget_field} does not bound an episode's tokens: set one of them"
            )
        return prompt + rollout.completion_budget
    new = rollout.sampling.max_new_tokens
    if prompt + new > limit:
        what = "data.format.max_prompt_length" if data.max_prompt_length else "the longest prompt"
        raise ValueError(
            f"{limit_field}={limit} is smaller than {what} ({prompt} tokens) + "
            f"{CB}.sampling.max_new_tokens ({new}) = {prompt + new}"
        )
    return None if live_policy else limit


def _engine_limit(module: GRPOModule, rollout: RolloutSide) -> tuple[int | None, str]:
    """(longest prompt + completion the engine takes as set (None: derived), the option that sets it)."""
    if rollout.engine is not None:  # an engine given with use_engine()
        return rollout.engine.max_model_len, "the engine's max_model_len"
    settings = rollout.engine_settings
    if not settings.samples_live_policy:
        return settings.context_limit()
    config = getattr(module.policy, "config", None)
    positions = getattr(config, "max_position_embeddings", None)
    if positions is None:
        positions = (model_config(module) or {}).get("max_position_embeddings")
    return positions, f"the policy's max_position_embeddings (engine {settings.name!r})"


def check_vocabulary(data: PromptDataModule, module: GRPOModule) -> None:
    """The data's tokenizer belongs to the policy: every token id has a row in the policy's embedding, and a
    tokenizer read from elsewhere than the policy's folder (``data.tokenizer_path``) also fills most of the
    embedding (a smaller one is another vocabulary) and ends with the policy's EOS token (`tokenizer_mismatch`)."""
    tokenizer = data.tokenizer
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
    source = data.tokenizer_source or type(tokenizer).__name__
    own = data.tokenizer_source is not None and data.tokenizer_source == module.tokenizer_source
    problem = tokenizer_mismatch(len(tokenizer), tokenizer.eos_token_id, rows, None if own else policy_eos_ids(module))
    if problem is not None:
        raise ValueError(
            f"data.tokenizer_path ({source}) does not belong to the policy ({where}): {problem}; leave "
            "data.tokenizer_path unset to use the policy's own tokenizer, or set it to the policy's folder"
        )
