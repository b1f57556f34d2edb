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

import os
import time
from dataclasses import replace
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from ..core.batch import BatchGeometry, RolloutBatch
from ..core import SELECTIONS
from ..data.reward_set import RewardSet, RewardSpec
from ..rollout.base import RolloutEngine, SamplingConfig, derive_seed, test_seed
from ..checks.validation import check_fit_config
from .async_rollout import AsyncRollout, VersionRecorder, staleness_metrics
from .async_setup import check_async_config, checkpoint_on_server_failure, install_async_correction
from .completions import CompletionLog, CompletionLogSettings
from .evaluation import evaluate_prompts
from .sampling import GroupSelector, SampleResult, sample_groups, score_rollout
from .weight_push import PolicyPush


class RolloutCallback(Callback):
    """Drives rollouts for :class:`~lightning_grpo.GRPOModule`.

    Args:
        engine: "vllm" (in-process vLLM, weights pushed after each optimizer step), "vllm_server"
            (vLLM servers, started here or given as ``vllm_args.urls``; weights pushed through
            vLLM's RL API; docs/distributed.md) or "hf" (transformers ``generate`` on the live policy).
        sampling: group size ``n`` (G, or G' with GFPO), temperature, top_p, top_k,
            max_new_tokens.
        rewards: reward functions with weights (default: exact match against ``answer``).
        seed: run seed; each rank and generation samples with a seed derived from it. None: the
            seed given to ``seed_everything`` (LightningCLI's ``--seed_everything``), else 0.
        vllm_args: keyword arguments of :class:`~lightning_grpo.rollout.vllm.VLLMEngine`
            (dtype, max_model_len, kv_cache_memory_bytes, enable_lora, sleep_level, ...); for "vllm_server" the
            fields of :class:`~lightning_grpo.rollout.vllm_server.ServerSettings` (urls, num_servers, ...).
        dynamic_sampling: drop groups whose rewards are all equal and refill (DAPO).
        dynamic_sampling_reward: the reward function (its name / alias) whose spread decides which
            groups dynamic sampling keeps (verl ``filter_groups.metric``, e.g. the accuracy reward
            when a length penalty is added); None = the weighted total.
        max_generation_rounds: generation rounds per batch with dynamic sampling (verl
            ``max_num_gen_batches``); after that the batch trains with what it has.
        gfpo_keep: GFPO: keep this many of the ``n`` completions per prompt (None = off).
        gfpo_metric: selection in ``SELECTIONS`` ("gfpo_length" or "gfpo_reward_per_token").
        overlong_filter: mask the loss of completions truncated without EOS (DAPO).
        weight_sync: push the policy into the engine after optimizer steps. Switch off only
            to measure the staleness it prevents.
        lora_sync: "merged" pushes W + delta_W as plain weights; "adapter" saves the adapter
            and lets vLLM apply it (needs ``vllm_args.enable_lora``).
        val_samples: n, the sampled completions per validation prompt for ``val/reward_mean``,
            ``val/mean@n`` and ``val/pass@k`` (0 = greedy accuracy only).
        val_pass_k: the k of ``val/pass@k`` (each in 1..n; unbiased estimator); None = [n].
        val_pass_threshold: a sample passes when the first reward function scores it at least this.
        forward_rows: rows per no-grad forward pass (reference / old log-probs).
        max_staleness: k >= 1 samples the next k generation batches on the servers while the
            trainer trains (engine "vllm_server"); a batch never trains with weights more than k
            optimizer steps newer than those that sampled it. 0 = synchronous.
        async_correction: with ``max_staleness >= 1``, the off-policy correction (``CORRECTIONS``)
            the loss uses when it has none of its own (behaviour = sampling weights); None = off.
        log_completions: every how many optimizer steps, and how many groups of, the sampled
            completions go to ``completions.jsonl`` and the logger's table (:mod:`.completions`).
    """

    def __init__(
        self,
        engine: Literal["vllm", "vllm_server", "hf"] = "vllm",
        sampling: SamplingConfig = SamplingConfig(),  # noqa: B008 - copied below; shown by --help / --print_config
        rewards: list[RewardSpec] | None = None,
        seed: int | None = None,
        vllm_args: dict[str, Any] | None = None,
        dynamic_sampling: bool = False,
        dynamic_sampling_reward: str | None = None,
        max_generation_rounds: int = 4,
        gfpo_keep: int | None = None,
        gfpo_metric: str = "gfpo_length",
        overlong_filter: bool = False,
        weight_sync: bool = True,
        lora_sync: Literal["merged", "adapter"] = "merged",
        val_samples: int = 4,
        val_pass_k: list[int] | None = None,
        val_pass_threshold: float = 1.0,
        forward_rows: int = 64,
        max_staleness: int = 0,
        async_correction: str | None = "tis_token",
        log_completions: CompletionLogSettings = CompletionLogSettings(),  # noqa: B008 - copied below
    ) -> None:
        check_async_config(engine, max_staleness, async_correction)
        self.engine_name = engine
        self.sampling = replace(sampling or SamplingConfig())  # a copy: guards and agents change it
        if self.sampling.greedy:
            raise ValueError("rollout.sampling.temperature must be > 0 for training (0 is greedy decoding)")
        self.reward_set = RewardSet(rewards or [RewardSpec("exact_match")])
        self.seed = seed
        self.vllm_args = dict(vllm_args or {})
        self.selector = GroupSelector(
            group_size=self.sampling.n,
            keep=gfpo_keep,
            selection=SELECTIONS.get(gfpo_metric) if gfpo_keep is not None else None,
            dynamic_sampling=dynamic_sampling,
            signal_column=self._reward_column(dynamic_sampling_reward),
        )
        if max_generation_rounds < 1:
            raise ValueError(f"max_generation_rounds must be >= 1, got {max_generation_rounds}")
        self.max_generation_rounds = max_generation_rounds
        self.overlong_filter = overlong_filter
        self.weight_sync = weight_sync
        self.lora_sync = lora_sync
        self._push = PolicyPush(lora_sync)
        self.val_samples = val_samples
        self.val_pass_k = list(val_pass_k) if val_pass_k is not None else None
        self.val_pass_threshold = val_pass_threshold
        self.forward_rows = forward_rows
        self.engine: RolloutEngine | None = None
        self._owns_engine = False
        self._engine_version = -1  # the trainer.global_step (optimizer steps) the engine's weights reflect
        self._train_time = 0.0
        self._batch_start = 0.0
        self.generations = 0
        self.max_staleness = max_staleness
        self.async_correction = async_correction
        self._pipeline: AsyncRollout | None = None
        self.completion_log = CompletionLog(replace(log_completions or CompletionLogSettings()))
        self._eval_batch = 0  # index of the validation / test batch being evaluated (test batches' seeds)
        #: The run's batch geometry (:class:`~lightning_grpo.core.batch.BatchGeometry`), built in :meth:`setup`.
        self.geometry: BatchGeometry | None = None

    # ------------------------------------------------------------------------ engine
    def _reward_column(self, name: str | None) -> int | None:
        if name is None:
            return None
        if name not in self.reward_set.names:
            raise ValueError(
                f"rollout.dynamic_sampling_reward {name!r} is not one of the configured rewards "
                f"{self.reward_set.names}"
            )
        return self.reward_set.names.index(name)

    def use_engine(self, engine: RolloutEngine) -> None:
        """Sample with an engine you built (it is not closed at teardown); its weights are
        pushed before the first generation."""
        self.engine, self._owns_engine, self._engine_version = engine, False, -1

    def _ensure_engine(self, trainer: L.Trainer, module: L.LightningModule) -> RolloutEngine:
        if self.engine is None:
            from ..rollout.factory import build_engine

            self.engine = build_engine(self.engine_name, module, trainer.datamodule.tokenizer, self.seed, self.vllm_args)
            self._owns_engine = True
        return self.engine

    def sync_weights(self, module: L.LightningModule) -> float:
        """Push the policy into the engine if it changed since the last push; returns seconds."""
        step = module.trainer.global_step
        if not self.engine.needs_weight_sync:
            return 0.0
        stale = self._engine_version != step and (self.weight_sync or self._engine_version < 0)
        if not stale and not self.engine.weights_discarded:  # (sleep level 2 dropped them: push anyway)
            return 0.0
        start = time.perf_counter()
        self._push(self.engine, module.policy, step, first=self._engine_version < 0)
        self._engine_version = step
        return time.perf_counter() - start

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        dm = trainer.datamodule
        if dm is None or not hasattr(dm, "generation_prompts"):
            raise RuntimeError(
                "RolloutCallback needs a lightning_grpo PromptDataModule: trainer.fit(module, datamodule=...)"
            )
        pl_module.use_evaluator(self.evaluate)
        if self.seed is None:
            self.seed = int(os.environ.get("PL_GLOBAL_SEED", 0))
        check_fit_config(trainer, pl_module, self)
        self.geometry = pl_module.batch_geometry(dm.batch_size, self.selector.out_group_size)
        dm.set_geometry(self.geometry)
        if self.max_staleness > 0:
            install_async_correction(pl_module, self.async_correction)

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
        elif self.engine is not None and self.lora_sync == "adapter":  # a user's engine: without our adapter
            self.engine.unload_lora_adapter()
        self._push.close()
        self._engine_version = -1

    # ---------------------------------------------------------------------- training
    @override
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
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
        per_gen = self.geometry.optimizer_steps
        generation = self.geometry.generation(trainer.global_step)
        if self.max_staleness == 0:
            sync = self.sync_weights(module)
            result = self._sample(trainer, generation)
            self.engine.sleep()  # a colocated engine gives its memory back to the trainer (vllm_args.sleep_level)
            return result, {"time/sync": sync}
        if self._pipeline is None:
            self._pipeline = self._async_pipeline(trainer, module, per_gen)
        return self._pipeline.next_batch(generation, trainer.global_step)

    def _sample(self, trainer: L.Trainer, generation: int) -> SampleResult:
        """Sample and score generation batch ``generation`` (any thread; seeds and prompts depend
        on ``generation`` and the rank only)."""
        dm = trainer.datamodule
        rank, world = trainer.global_rank, trainer.world_size
        engine = VersionRecorder(self.engine)

        def prompts_for(round_: int) -> list[dict]:
            return dm.generation_prompts(generation, rank, world, round_, self.max_generation_rounds)

        def seed_for(round_: int) -> int:
            return derive_seed(self.seed, rank, generation * self.max_generation_rounds + round_)

        result = self._sample_groups(trainer, engine, prompts_for, seed_for)
        result.metrics.update(engine.metrics())
        return result

    def _async_pipeline(self, trainer: L.Trainer, module: L.LightningModule, per_gen: int) -> AsyncRollout:
        from ..models.weights import gathered_weights_for_engine

        def prepare(step: int):
            self._engine_version = step
            with gathered_weights_for_engine(module.policy) as weights:  # snapshot taken inside (FSDP2: gathered)
                return self.engine.prepare_push(weights)

        return AsyncRollout(self.max_staleness, per_gen, prepare, self.engine.send_push, lambda g: self._sample(trainer, g))

    def _use_batch(self, trainer: L.Trainer, module: L.LightningModule, result: SampleResult, times: dict[str, float]) -> None:
        times["time/generate"], times["time/reward"] = result.generate_time, result.reward_time
        result.metrics.update(staleness_metrics(result.metrics, trainer.global_step, self.max_staleness or None))
        start = time.perf_counter()
        tensors = result.tensors
        mask = tensors.completion_mask
        if self.overlong_filter:
            mask = mask * torch.tensor(result.finished, dtype=mask.dtype).unsqueeze(-1)
        batch = RolloutBatch(
            input_ids=tensors.input_ids,
            attention_mask=tensors.attention_mask,
            completion_mask=mask,
            advantages=torch.zeros(len(mask)),
            rollout_logp=tensors.rollout_logprobs,
            prompt_length=tensors.input_ids.shape[1] - mask.shape[1],
            group_size=result.group_size,
            temperature=self.sampling.temperature,
            turn_ids=tensors.turn_ids,
        ).to(module.device)
        batch = module.prepare_rollout_batch(
            batch, result.rewards.to(module.device), result.weights.to(module.device), records=result.records
        )
        times["time/prepare"] = time.perf_counter() - start
        module.use_rollout(batch, {**result.metrics, **self.reward_set.totals(), **times})
        self.generations += 1
        self.completion_log.new_batch(trainer, module, result, self.reward_set.names)
        for callback in trainer.callbacks:  # guards inspect the fresh batch before it trains
            hook = getattr(callback, "on_rollout_end", None)
            if hook is not None:
                hook(trainer, module, batch)

    def _sample_groups(self, trainer: L.Trainer, engine: RolloutEngine, prompts_for, seed_for) -> SampleResult:
        """One generation batch of kept groups (subclasses sample multi-turn episodes here)."""
        dm = trainer.datamodule
        return sample_groups(
            engine, self.reward_set, dm.tokenizer, self.sampling, self.selector, prompts_for, seed_for,
            target_groups=dm.batch_size, max_rounds=self.max_generation_rounds,
        )  # fmt: skip

    # -------------------------------------------------------------------- validation
    @override
    def on_validation_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int,
                                  dataloader_idx: int = 0) -> None:  # fmt: skip
        self._eval_batch = batch_idx

    @override
    def on_test_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int,
                            dataloader_idx: int = 0) -> None:  # fmt: skip
        self._eval_batch = batch_idx

    def eval_seed(self, module: L.LightningModule, split: str) -> int:
        """The seed of the held-out batch being evaluated: a dev (``val``) check draws from the run seed + 1 at
        the optimizer step; a test batch from :func:`~lightning_grpo.rollout.base.test_seed` (never a
        training generation's seed, and the same whatever checkpoint is tested)."""
        rank = module.trainer.global_rank
        if split == "test":
            return test_seed(self.seed, rank, self._eval_batch)
        return derive_seed(self.seed + 1, rank, module.trainer.global_step)

    def evaluate(self, module: L.LightningModule, records: list[dict], split: str = "val") -> dict[str, float]:
        """Held-out metrics (``<split>/...``) of a batch of prompt records (called by ``GRPOModule.validation_step``
        with ``split="val"``, the dev split, and ``GRPOModule.test_step`` with ``"test"``)."""
        trainer = module.trainer
        engine = self._ensure_engine(trainer, module)
        seed = self.eval_seed(module, split)
        args = (engine, self.reward_set, trainer.datamodule.tokenizer, records, self.sampling, self.val_samples, seed,
                self.val_pass_k, self.val_pass_threshold, split)  # fmt: skip
        if self._pipeline is not None:  # the worker owns the servers: queue behind its work
            return self._pipeline.call(trainer.global_step, lambda: evaluate_prompts(*args))
        self.sync_weights(module)
        metrics = evaluate_prompts(*args)
        engine.sleep()
        return metrics

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
        return {"seed": self.seed, "generations": self.generations, "dynamic_sampling": self.dynamic_sampling,
                "temperature": self.sampling.temperature}  # fmt: skip

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.seed = state_dict["seed"]
        self.generations = state_dict["generations"]
        self.set_dynamic_sampling(state_dict.get("dynamic_sampling", self.dynamic_sampling))  # a guard may have changed them
        self.set_temperature(state_dict.get("temperature", self.sampling.temperature))
        self._engine_version = -1  # a resumed run always pushes before its first generation
