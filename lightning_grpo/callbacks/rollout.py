"""RolloutCallback: samples and scores the groups for each generation batch, keeps the engine's
weights in step with the policy, and evaluates on held-out prompts.

Per generation (at the first training step it feeds):

    push weights if the policy changed -> prompts for (step, rank) -> engine.generate -> rewards
    -> [GFPO: keep k of G'] -> [dynamic sampling: drop equal-reward groups, refill] ->
    [overlong filter] -> module.prepare_rollout_batch -> module.use_rollout
    -> on_rollout_end(trainer, module, batch) of every callback that has it (the guards)

Every phase is timed (``time/generate``, ``time/reward``, ``time/prepare``, ``time/sync``,
``time/train``) and logged with the rollout statistics.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Protocol, runtime_checkable

import lightning as L
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from ..checks.preflight import servers
from ..core import SELECTIONS
from ..core.batch import RolloutBatch
from ..data.reward_set import RewardSet, RewardSpec
from ..data.reward_spec import RewardName
from ..plan.run_plan import RolloutSide, RunPlan
from ..rollout.base import RolloutEngine, SamplingConfig, derive_seed
from ..rollout.factory import EngineContext, EngineSettings, resolve_engine
from .async_rollout import AsyncRollout, VersionRecorder, staleness_metrics
from .async_setup import check_async_config, checkpoint_on_server_failure
from .completions import CompletionLog, CompletionLogSettings
from .evaluation import HeldOutEvaluation
from .push_check import PushCheck
from .sampling import GroupSelector, SampleResult, sample_groups, training_batch
from .settings import EvaluationSettings, SelectionSettings, WeightSyncSettings
from .weight_push import PolicyPush


@runtime_checkable
class RolloutListener(Protocol):
    """A Trainer callback that inspects each fresh rollout batch before it trains (the guards)."""

    def on_rollout_end(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: RolloutBatch) -> None: ...


class RolloutCallback(HeldOutEvaluation, Callback):
    """Drives rollouts for `GRPOModule`.

    Args:
        engine: the engine and its settings: `VLLMArgs` (vLLM in this process, weights pushed after each
            optimizer step: dtype, max_model_len, kv_cache_memory_bytes, gpu_memory_utilization, enable_lora,
            sleep_level, ...), `ServerSettings` (vLLM servers, started here or given as ``urls``; weights
            pushed through vLLM's RL API; docs/guide/scaling.md) or `HFSettings` (transformers ``generate`` on
            the live policy). A short name, "vllm", "vllm_server" or "hf", is that engine with its defaults,
            which follow the device and the model (`VLLMArgs`).
        sampling: group size ``n`` (G, or G' with GFPO), temperature, top_p, top_k, max_new_tokens.
        rewards: reward functions with weights (default: exact match against ``answer``); a name alone
            (``my_rewards.fn``, or a list of names and specs) stands for ``{name: my_rewards.fn}``.
        selection: which samples train (`SelectionSettings`): dynamic sampling (DAPO),
            GFPO, the overlong filter, generation rounds.
        evaluation: held-out metrics (`EvaluationSettings`): samples per prompt,
            pass@k, the pass threshold.
        weight_sync: pushing the policy into the engine (`WeightSyncSettings`):
            on / off, LoRA merged or as an adapter.
        max_staleness: k >= 1 samples the next k generation batches on the servers while the
            trainer trains (an engine that can: "vllm_server"); a batch never trains with weights more than k
            optimizer steps newer than those that sampled it. It needs an off-policy correction in the
            loss (``model.loss.init_args.off_policy.correction``). 0 = synchronous.
        log_completions: every how many optimizer steps, and how many groups of, the sampled
            completions go to ``completions.jsonl`` and the logger's table (`.completions`).
        seed: sampling seed; each rank and generation samples with a seed derived from it. None: the
            run seed (``seed_everything``, LightningCLI's ``--seed_everything``; else 0), which the data's
            prompt order and the built-in tiny model's initialisation follow too (`RunPlan`).

    Example:
        ```python
        import lightning as L

        from lightning_grpo import RewardSpec, RolloutCallback, SamplingConfig

        rollouts = RolloutCallback(
            engine="vllm",
            sampling=SamplingConfig(n=8, temperature=1.0, max_new_tokens=256),
            rewards=[RewardSpec("math_accuracy"), RewardSpec("my_pkg.rewards:format_ok", weight=0.1)],
        )
        trainer = L.Trainer(max_steps=500, callbacks=[rollouts])
        ```
    """

    def __init__(
        self,
        engine: EngineSettings | str = "vllm",
        sampling: SamplingConfig = SamplingConfig(),  # noqa: B008 - copied below
        rewards: list[RewardSpec | RewardName] | RewardName | None = None,
        selection: SelectionSettings = SelectionSettings(),  # noqa: B008 - copied below
        evaluation: EvaluationSettings = EvaluationSettings(),  # noqa: B008 - copied below
        weight_sync: WeightSyncSettings = WeightSyncSettings(),  # noqa: B008 - copied below
        max_staleness: int = 0,
        log_completions: CompletionLogSettings = CompletionLogSettings(),  # noqa: B008 - copied below
        seed: int | None = None,
    ) -> None:
        self.engine_settings = resolve_engine(engine)  # a copy, or the defaults a short name stands for
        check_async_config(self.engine_settings, max_staleness)
        self.sampling = replace(sampling or SamplingConfig())  # a copy: guards and agents change it
        if self.sampling.greedy:
            raise ValueError("rollout.sampling.temperature must be > 0 for training (0 is greedy decoding)")
        self.reward_set = RewardSet(rewards or [RewardSpec("exact_match")])
        self.seed = seed
        self.selection = replace(selection)
        self.selector = GroupSelector(
            group_size=self.sampling.n,
            keep=selection.gfpo_keep,
            selection=SELECTIONS.get(selection.gfpo_metric) if selection.gfpo_keep is not None else None,
            dynamic_sampling=selection.dynamic_sampling,
            signal_column=self._reward_column(selection.dynamic_sampling_reward),
        )
        self.evaluation = replace(evaluation)
        self.weight_sync = replace(weight_sync)
        self._push = PolicyPush(weight_sync.lora)
        self._check = PushCheck(weight_sync.check_every, weight_sync.check_tolerance, weight_sync.lora == "adapter")
        self.engine: RolloutEngine | None = None
        self._owns_engine = False
        self._engine_version = -1  # the trainer.global_step (optimizer steps) the engine's weights reflect
        self._train_time = 0.0
        self._batch_start = 0.0
        self.generations = 0
        self.max_staleness = max_staleness
        self._pipeline: AsyncRollout | None = None
        self.completion_log = CompletionLog(replace(log_completions or CompletionLogSettings()))
        self._eval_batch = 0  # index of the validation / test batch being evaluated (test batches' seeds)
        self._plan: RunPlan | None = None  # the run's, resolved (or taken over from `use_plan`) in setup
        self._handed_plan: RunPlan | None = None  # resolved by the command line for the next setup
        self._resumed_seed: int | None = None  # the sampling seed a resumed run's checkpoint holds

    @property
    def max_generation_rounds(self) -> int:
        """Generation rounds per batch (``rollout.selection.max_generation_rounds``)."""
        return self.selection.max_generation_rounds

    # ------------------------------------------------------------------------ engine
    def _reward_column(self, name: str | None) -> int | None:
        if name is None:
            return None
        if name not in self.reward_set.names:
            raise ValueError(
                f"rollout.selection.dynamic_sampling_reward {name!r} is not one of the configured rewards "
                f"{self.reward_set.names}"
            )
        return self.reward_set.names.index(name)

    def use_engine(self, engine: RolloutEngine) -> None:
        """Sample with an engine you built (it is not closed at teardown); its weights are
        pushed before the first generation."""
        self.engine, self._owns_engine, self._engine_version = engine, False, -1

    def _ensure_engine(self, trainer: L.Trainer, module: L.LightningModule) -> RolloutEngine:
        if self.engine is None:
            broadcast = (
                (lambda obj: trainer.strategy.broadcast(obj, src=0)) if trainer.world_size > 1 else (lambda obj: obj)
            )
            context = EngineContext(trainer.global_rank, trainer.world_size, trainer.log_dir, broadcast)
            dm, plan = trainer.datamodule, self.plan
            self.engine = plan.engine_settings.build(
                module,
                dm.tokenizer,
                self.sampling_seed,
                context,
                max_model_len=plan.context_length,
                sequences=plan.geometry.prompts * self.sampling.n,
            )
            self._owns_engine = True
        return self.engine

    def completion_budget(self) -> tuple[int | None, str]:
        """Tokens a sample may take after its prompt, and the option that sets them (None: no bound known,
        so ``max_model_len`` must be set)."""
        return self.sampling.max_new_tokens, "rollout.sampling.max_new_tokens"

    def probe_rewards(self, records: list[dict], tokenizer: Any) -> None:
        """Run every reward function on stand-in completions of ``records`` (`reward_probe`)."""
        from ..data.reward_probe import probe_rewards

        probe_rewards(self.reward_set, records, tokenizer)

    def template_conversations(self, records: list[dict]) -> list[tuple[list[dict], Any, str]]:
        """The multi-turn conversations the chat-template check renders (`check_chat_template`): none here, a
        single-turn rollout renders its prompt once and never a completion."""
        return []

    def sync_weights(self, module: L.LightningModule) -> float:
        """Push the policy into the engine if it changed since the last push, then check the push when due
        (``rollout.weight_sync.check_every``; an engine on the live policy is checked when the policy changed);
        returns the push's seconds."""
        step = module.trainer.global_step
        if not self.engine.needs_weight_sync:
            if self._engine_version != step:
                self._engine_version = step
                self._check.after_push(self.engine, module, step)
            return 0.0
        stale = self._engine_version != step and (self.weight_sync.enabled or self._engine_version < 0)
        if not stale and not self.engine.weights_discarded:  # (sleep level 2 dropped them: push anyway)
            return 0.0
        start = time.perf_counter()
        self._push(self.engine, module.policy, step, first=self._engine_version < 0)
        self._engine_version = step
        seconds = time.perf_counter() - start
        self._check.after_push(self.engine, module, step)  # raises WeightPushError when the push did not land
        return seconds

    # -------------------------------------------------------------------------- plan
    def plan_side(self) -> RolloutSide:
        """This callback's settings as the run plan reads them."""
        budget, budget_field = self.completion_budget()
        keep = self.selection.gfpo_keep
        return RolloutSide(
            engine_settings=self.engine_settings,
            engine=self.engine,
            sampling=self.sampling,
            group_size=self.selector.out_group_size,
            group_field="rollout.selection.gfpo_keep" if keep is not None else "rollout.sampling.n",
            completion_budget=budget,
            budget_field=budget_field,
            seed=self.seed,
            max_staleness=self.max_staleness,
            lora_sync=self.weight_sync.lora,
            sync_enabled=self.weight_sync.enabled,
            servers=tuple(servers(self)),
            conversations=self.template_conversations,
            probe_rewards=self.probe_rewards,
        )

    def use_plan(self, plan: RunPlan) -> None:
        """Run the next fit by ``plan`` (the command line resolves it before ``trainer.fit``); without a call,
        `setup` resolves it (every fit, validate or test resolves its own)."""
        self._handed_plan = plan

    @property
    def plan(self) -> RunPlan:
        """The run plan (resolved in `setup`)."""
        if self._plan is None:
            raise RuntimeError("RolloutCallback.plan is resolved in setup: trainer.fit(module, datamodule=...)")
        return self._plan

    @property
    def sampling_seed(self) -> int:
        """The seed every rank's and generation's sampling seed derives from: the one a resumed run's checkpoint
        holds, else the plan's (``rollout.seed``, else the run seed; a set ``rollout.seed`` needs no plan)."""
        if self._resumed_seed is not None:
            return self._resumed_seed
        return self.seed if self._plan is None and self.seed is not None else self.plan.sampling_seed

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        dm = trainer.datamodule
        if dm is None or not hasattr(dm, "generation_prompts"):
            raise RuntimeError(
                "RolloutCallback needs a lightning_grpo PromptDataModule: trainer.fit(module, datamodule=...)"
            )
        self._plan = self._handed_plan or RunPlan.resolve(trainer, pl_module, dm, self.plan_side())
        self._handed_plan = None
        pl_module.use_geometry(self._plan.geometry)
        dm.set_geometry(self._plan.geometry)

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Log the held-out metrics of the untrained policy at step 0 (the curve's starting point)."""
        records = trainer.datamodule.val_records
        if not records or trainer.limit_val_batches == 0 or trainer.global_step > 0:
            return
        metrics = self.evaluate(pl_module, records)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=0)

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._pipeline is not None:
            self._pipeline.close()
            self._pipeline = None
        if self.engine is not None and self._owns_engine:
            self.engine.close()
            self.engine = None
        elif self.engine is not None and self.weight_sync.lora == "adapter":  # a user's engine: without our adapter
            self.engine.unload_lora_adapter()
        self._push.close()
        self._check.reset()
        self._engine_version = -1

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        """A run stopped by an error or Ctrl-C releases the engine (and its weight copy) as :meth:`teardown`
        does: Lightning calls no ``teardown`` then."""
        self.teardown(trainer, pl_module, "fit")

    # ---------------------------------------------------------------------- training
    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if int(batch["micro"]) == 0:
            self._generate(trainer, pl_module)
        self._batch_start = time.perf_counter()

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch: Any, batch_idx: int) -> None:
        self._train_time += time.perf_counter() - self._batch_start

    def _generate(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self._ensure_engine(trainer, module)
        times = {"time/train": self._train_time}
        self._train_time = 0.0
        with checkpoint_on_server_failure(trainer):
            result, phase_times = self._next_batch(trainer, module)
        times.update(phase_times)
        self._use_batch(trainer, module, result, times)

    def _next_batch(self, trainer: L.Trainer, module: L.LightningModule) -> tuple[SampleResult, dict[str, float]]:
        """The generation batch for this step: sampled now (synchronous) or by the pipeline."""
        generation = self.plan.geometry.generation(trainer.global_step)
        if self.max_staleness == 0:
            sync = self.sync_weights(module)
            result = self._sample(trainer, generation)
            self._check.take_probe(module, result.tensors, self.engine, trainer.global_step)  # awake: it scores it
            self.engine.sleep()  # a colocated engine gives its memory back to the trainer (VLLMArgs.sleep_level)
            return result, {"time/sync": sync, "time/push_check": self._check.take_seconds()}
        if self._pipeline is None:
            self._pipeline = self._async_pipeline(trainer, module)
        result, times = self._pipeline.next_batch(generation, trainer.global_step)
        self._check.take_probe(module, result.tensors, self.engine, trainer.global_step, calibrate=False)  # see send
        return result, times

    def _sample(self, trainer: L.Trainer, generation: int) -> SampleResult:
        """Sample and score generation batch ``generation`` (any thread; seeds and prompts depend
        on ``generation`` and the rank only)."""
        dm = trainer.datamodule
        rank, world = trainer.global_rank, trainer.world_size
        engine = VersionRecorder(self.engine)

        def prompts_for(round_: int) -> list[dict]:
            return dm.generation_prompts(generation, rank, world, round_, self.max_generation_rounds)

        def seed_for(round_: int) -> int:
            return derive_seed(self.sampling_seed, rank, generation * self.max_generation_rounds + round_)

        result = self._sample_groups(trainer, engine, prompts_for, seed_for)
        result.metrics.update(engine.metrics())
        return result

    def _async_pipeline(self, trainer: L.Trainer, module: L.LightningModule) -> AsyncRollout:
        from ..models.weights import gathered_weights_for_engine

        def prepare(step: int):
            self._engine_version = step
            with gathered_weights_for_engine(module.policy) as weights:  # snapshot taken inside (FSDP2: gathered)
                payload = self.engine.prepare_push(weights)
            return payload, self._check.prepare(module, step)  # the trainer's side of the push check

        def send(prepared, step: int) -> None:
            self._check.calibrate(self.engine)  # the first push after the probe: the engine holds its weights still
            self.engine.send_push(prepared[0], step)
            if prepared[1] is not None:
                self._check.verify(self.engine, *prepared[1])

        steps = self.plan.geometry.optimizer_steps  # per generation batch
        return AsyncRollout(self.max_staleness, steps, prepare, send, lambda g: self._sample(trainer, g))

    def _use_batch(
        self, trainer: L.Trainer, module: L.LightningModule, result: SampleResult, times: dict[str, float]
    ) -> None:
        times["time/generate"], times["time/reward"] = result.generate_time, result.reward_time
        result.metrics.update(staleness_metrics(result.metrics, trainer.global_step, self.max_staleness or None))
        start = time.perf_counter()
        batch = training_batch(result, self.sampling.temperature, self.selection.overlong_filter).to(module.device)
        scored = None if result.scored is None else result.scored.to(module.device)  # [B]
        batch = module.prepare_rollout_batch(
            batch,
            result.rewards.to(module.device),
            result.weights.to(module.device),
            records=result.records,
            scored=scored,
        )
        times["time/prepare"] = time.perf_counter() - start
        module.use_rollout(batch, {**result.metrics, **self.reward_set.totals(), **times})
        self.generations += 1
        self.completion_log.new_batch(trainer, module, result, self.reward_set.names)
        for callback in trainer.callbacks:  # guards inspect the fresh batch before it trains
            if isinstance(callback, RolloutListener):
                callback.on_rollout_end(trainer, module, batch)

    def _sample_groups(self, trainer: L.Trainer, engine: RolloutEngine, prompts_for, seed_for) -> SampleResult:
        """One generation batch of kept groups (subclasses sample multi-turn episodes here)."""
        dm = trainer.datamodule
        return sample_groups(
            engine,
            self.reward_set,
            dm.tokenizer,
            self.sampling,
            self.selector,
            prompts_for,
            seed_for,
            target_groups=dm.batch_size,
            max_rounds=self.max_generation_rounds,
        )

    # ------------------------------------------------------- settings guards may change
    @property
    def dynamic_sampling(self) -> bool:
        return self.selector.dynamic_sampling

    def set_dynamic_sampling(self, on: bool) -> None:
        """Switch dynamic sampling on / off from the next generation (ZeroStdGuard ``fix``)."""
        self.selector.dynamic_sampling = bool(on)

    def set_temperature(self, temperature: float) -> None:
        """Sample (and compute log-probs) at ``temperature`` from the next generation on."""
        if not temperature > 0:
            raise ValueError(f"rollout.sampling.temperature must be > 0 for training, got {temperature}")
        self.sampling = replace(self.sampling, temperature=float(temperature))

    # ------------------------------------------------------------------------- state
    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "seed": self.sampling_seed,
            "generations": self.generations,
            "dynamic_sampling": self.dynamic_sampling,
            "temperature": self.sampling.temperature,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._resumed_seed = state_dict["seed"]
        self.generations = state_dict["generations"]
        self.set_dynamic_sampling(
            state_dict.get("dynamic_sampling", self.dynamic_sampling)
        )  # a guard may have changed them
        self.set_temperature(state_dict.get("temperature", self.sampling.temperature))
        self._engine_version = -1  # a resumed run always pushes before its first generation
