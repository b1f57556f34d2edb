"""GenerationStep: the generation batch of a training step, sampled now or by the asynchronous pipeline, and its
hand-over to the module.

Synchronous (``rollout.max_staleness: 0``): push the weights if the policy changed, sample and score the batch
(the prompts and seeds of each round follow the generation and the rank only), keep a probe for the push check,
put a colocated engine to sleep. Asynchronous: the :class:`~.async_rollout.AsyncRollout` pipeline samples up to
``max_staleness`` batches ahead on a worker thread and pushes through the engine link's two halves of a push.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import lightning as L

from ..core.batch import RolloutBatch
from ..data.reward_set import RewardSet
from ..plan.run_plan import RunPlan
from ..rollout.base import RolloutEngine, derive_seed
from .async_rollout import AsyncRollout, VersionRecorder, staleness_metrics
from .engine_link import EngineLink
from .sampling import SampleResult, training_batch

#: (trainer, engine, prompts_for(round), seed_for(round)) -> one generation batch of kept groups: the rollout
#: callback's ``_sample_groups`` (single completions, or multi-turn episodes in the agent callback).
SampleGroups = Callable[[L.Trainer, RolloutEngine, Callable[[int], list[dict]], Callable[[int], int]], SampleResult]


class GenerationStep:
    """Makes each generation batch on the engine of ``link`` (see the module docstring)."""

    def __init__(self, link: EngineLink, max_staleness: int, sample_groups: SampleGroups) -> None:
        self.link = link
        self.max_staleness = max_staleness
        self._sample_groups = sample_groups
        self.pipeline: AsyncRollout | None = None  # the asynchronous pipeline, from the first batch on

    def next_batch(
        self, trainer: L.Trainer, module: L.LightningModule, plan: RunPlan, seed: int, rounds: int
    ) -> tuple[SampleResult, dict[str, float]]:
        """The generation batch for this step and its phases' seconds; ``seed``: the sampling seed, ``rounds``:
        generation rounds per batch."""
        generation = plan.geometry.generation(trainer.global_step)
        if self.max_staleness == 0:
            sync = self.link.sync(module)
            result = self.sample(trainer, generation, seed, rounds)
            self.link.take_probe(module, result.tensors, trainer.global_step)  # awake: it scores it
            self.link.engine.sleep()  # a colocated engine gives its memory back to the trainer (VLLMArgs.sleep_level)
            return result, {"time/sync": sync, "time/push_check": self.link.check_seconds()}
        if self.pipeline is None:
            self.pipeline = AsyncRollout(
                self.max_staleness,
                plan.geometry.optimizer_steps,  # per generation batch
                lambda step: self.link.prepare_push(module, step),
                self.link.send_push,
                lambda g: self.sample(trainer, g, seed, rounds),
            )
        result, times = self.pipeline.next_batch(generation, trainer.global_step)
        self.link.take_probe(module, result.tensors, trainer.global_step, calibrate=False)  # see send_push
        return result, times

    def sample(self, trainer: L.Trainer, generation: int, seed: int, rounds: int) -> SampleResult:
        """Sample and score generation batch ``generation`` (any thread; seeds and prompts depend
        on ``generation`` and the rank only)."""
        dm = trainer.datamodule
        rank, world = trainer.global_rank, trainer.world_size
        engine = VersionRecorder(self.link.engine)

        def prompts_for(round_: int) -> list[dict]:
            return dm.generation_prompts(generation, rank, world, round_, rounds)

        def seed_for(round_: int) -> int:
            return derive_seed(seed, rank, generation * rounds + round_)

        result = self._sample_groups(trainer, engine, prompts_for, seed_for)
        result.metrics.update(engine.metrics())
        return result

    def hand_over(
        self,
        trainer: L.Trainer,
        module: L.LightningModule,
        result: SampleResult,
        times: dict[str, float],
        temperature: float,
        overlong_filter: bool,
        reward_set: RewardSet,
    ) -> RolloutBatch:
        """Turn ``result`` into the module's rollout batch (``module.prepare_rollout_batch``) and hand it over with
        its metrics (``module.use_rollout``); returns the batch."""
        times["time/generate"], times["time/reward"] = result.generate_time, result.reward_time
        result.metrics.update(staleness_metrics(result.metrics, trainer.global_step, self.max_staleness or None))
        start = time.perf_counter()
        batch = training_batch(result, temperature, overlong_filter).to(module.device)
        scored = None if result.scored is None else result.scored.to(module.device)  # [B]
        batch = module.prepare_rollout_batch(
            batch,
            result.rewards.to(module.device),
            result.weights.to(module.device),
            records=result.records,
            scored=scored,
        )
        times["time/prepare"] = time.perf_counter() - start
        module.use_rollout(batch, {**result.metrics, **reward_set.totals(), **times})
        return batch

    def close(self) -> None:
        """Stop the asynchronous pipeline, if one runs."""
        if self.pipeline is not None:
            self.pipeline.close()
            self.pipeline = None
