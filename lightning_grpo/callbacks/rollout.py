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
from ..core.batch import RolloutBatch
from ..data.datamodule import PromptDataModule
from ..data.reward_set import RewardSet, RewardSpec
from ..data.reward_spec import RewardName
from ..plan.run_plan import RolloutSide, RunPlan
from ..rollout.base import RolloutEngine, SamplingConfig
from ..rollout.factory import EngineContext, EngineSettings, resolve_engine
from .async_setup import check_async_config, checkpoint_on_server_failure
from .completions import CompletionLog, CompletionLogSettings
from .engine_link import EngineLink
from .evaluation import HeldOutEvaluation
from .generation import GenerationStep
from .plan_slot import PlanSlot
from .sampling import GroupSelector, SampleResult, sample_groups
from .settings import EvaluationSettings, SelectionSettings, WeightSyncSettings


@runtime_checkable
class RolloutListener(Protocol):
    """A Trainer callback that inspects each fresh rollout batch before it trains (the guards)."""

    def on_rollout_end(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: RolloutBatch) -> None: ...


class RolloutCallback(HeldOutEvaluation, Callback):
    """Drives rollouts for `GRPOModule`.

    Args:
        engine: the engine and its settings: `VLLMArgs` (vLLM in this process, weights pushed after each
            optimizer step: dtype, max_model_len, kv_cache_memory_bytes, gpu_memory_utilization, lora,
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
        self.plans = PlanSlot(seed)
        self.selection = replace(selection)
        self.selector = GroupSelector.for_selection(selection, self.sampling.n, self.reward_set.names)
        self.evaluation = replace(evaluation)
        self.link = EngineLink(replace(weight_sync))
        self.generation = GenerationStep(self.link, max_staleness, self._sample_groups)
        self._train_time = 0.0
        self._batch_start = 0.0
        self.generations = 0
        self.completion_log = CompletionLog(replace(log_completions or CompletionLogSettings()))
        self._eval_batch = 0  # index of the validation / test batch being evaluated (test batches' seeds)

    @property
    def max_generation_rounds(self) -> int:
        """Generation rounds per batch (``rollout.selection.max_generation_rounds``)."""
        return self.selection.max_generation_rounds

    @property
    def max_staleness(self) -> int:
        """Generation batches sampled ahead while the trainer trains (``rollout.max_staleness``; 0: synchronous)."""
        return self.generation.max_staleness

    @property
    def seed(self) -> int | None:
        """``rollout.seed`` (None: the run seed)."""
        return self.plans.seed

    # ------------------------------------------------------------------------ engine
    @property
    def engine(self) -> RolloutEngine | None:
        """The engine (None until the first generation or evaluation builds it, or `use_engine`)."""
        return self.link.engine

    @property
    def weight_sync(self) -> WeightSyncSettings:
        """Pushing the policy into the engine (``rollout.weight_sync``)."""
        return self.link.weight_sync

    def use_engine(self, engine: RolloutEngine) -> None:
        """Sample with an engine you built (it is not closed at teardown); its weights are
        pushed before the first generation."""
        self.link.use(engine)

    def ensure_engine(self, trainer: L.Trainer, module: L.LightningModule) -> RolloutEngine:
        """The rollout engine, built on first use (or the one handed over with `use_engine`)."""
        return self.link.ensure(lambda: self._build_engine(trainer, module))

    def _build_engine(self, trainer: L.Trainer, module: L.LightningModule) -> RolloutEngine:
        broadcast = (
            (lambda obj: trainer.strategy.broadcast(obj, src=0)) if trainer.world_size > 1 else (lambda obj: obj)
        )
        context = EngineContext(trainer.global_rank, trainer.world_size, trainer.log_dir, broadcast)
        plan = self.plan
        return plan.engine_settings.build(
            module,
            trainer.datamodule.tokenizer,
            self.sampling_seed,
            context,
            max_model_len=plan.context_length,
            sequences=plan.geometry.prompts * self.sampling.n,
        )

    def sync_weights(self, module: L.LightningModule) -> float:
        """Push the policy into the engine if it changed since the last push, then check the push when due
        (``rollout.weight_sync.check_every``; an engine on the live policy is checked when the policy changed);
        returns the push's seconds."""
        return self.link.sync(module)

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

    def environment_settings(self) -> dict[str, Any]:
        """The environment's arguments, whose ``url`` / ``*_url`` servers the run checks before it starts
        (`servers`): none here, a single-turn rollout has no environment."""
        return {}

    # -------------------------------------------------------------------------- plan
    def plan_side(self) -> RolloutSide:
        """This callback's settings as the run plan reads them."""
        budget, budget_field = self.completion_budget()
        keep = self.selection.gfpo_keep
        urls = servers(self.engine_settings, self.engine, self.reward_set, self.environment_settings())
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
            servers=tuple(urls),
            conversations=self.template_conversations,
            probe_rewards=self.probe_rewards,
        )

    def use_plan(self, plan: RunPlan) -> None:
        """Run the next fit by ``plan`` (the command line resolves it before ``trainer.fit``); without a call,
        `setup` resolves it (every fit, validate or test resolves its own)."""
        self.plans.hand(plan)

    @property
    def plan(self) -> RunPlan:
        """The run plan (resolved in `setup`)."""
        return self.plans.plan

    @property
    def sampling_seed(self) -> int:
        """The seed every rank's and generation's sampling seed derives from: the one a resumed run's checkpoint
        holds, else the plan's (``rollout.seed``, else the run seed; a set ``rollout.seed`` needs no plan)."""
        return self.plans.sampling_seed

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        dm = trainer.datamodule
        if not isinstance(dm, PromptDataModule):
            raise RuntimeError(
                "RolloutCallback needs a lightning_grpo PromptDataModule: trainer.fit(module, datamodule=...)"
            )
        plan = self.plans.take(lambda: RunPlan.resolve(trainer, pl_module, dm, self.plan_side()))
        pl_module.use_geometry(plan.geometry)
        dm.set_geometry(plan.geometry)

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.generation.close()
        self.link.close()

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
        """Sample this step's generation batch, hand it to the module, log its completions, show it to the
        listeners (`RolloutListener`)."""
        self.ensure_engine(trainer, module)
        times = {"time/train": self._train_time}
        self._train_time = 0.0
        with checkpoint_on_server_failure(trainer):
            result, phase_times = self.generation.next_batch(
                trainer, module, self.plan, self.sampling_seed, self.max_generation_rounds
            )
        times.update(phase_times)
        batch = self.generation.hand_over(
            trainer, module, result, times, self.sampling.temperature, self.selection.overlong_filter, self.reward_set
        )
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
        self.plans.resume(state_dict["seed"])
        self.generations = state_dict["generations"]
        self.set_dynamic_sampling(
            state_dict.get("dynamic_sampling", self.dynamic_sampling)
        )  # a guard may have changed them
        self.set_temperature(state_dict.get("temperature", self.sampling.temperature))
        self.link.push_again()  # a resumed run always pushes before its first generation
