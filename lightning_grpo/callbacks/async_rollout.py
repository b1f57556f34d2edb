"""The asynchronous rollout pipeline (``RolloutCallback(max_staleness=k)``, k >= 1).

Generation batch ``g`` trains at optimizer steps ``g*P .. g*P+P-1`` (P optimizer steps per
generation batch). The pipeline samples it on a background thread with the weights of version
``v`` (the ``trainer.global_step`` they were pushed at) as soon as ``g*P - v <= k``: while the
trainer trains batch ``g``, batches ``g+1 .. g+k`` are already being sampled. One worker thread
runs, in order, every queued weight push and generation, so a generation always uses the
weights pushed before it was queued, and a push never lands in the middle of a generation:

    step s (first step of batch g):  queue [push v=s] + [generate h] for every h <= (s + k) / P
                                     not queued yet; wait for batch g; train it.

So a batch is never trained with weights more than k versions newer than those that sampled it
(``train/staleness_max`` <= k), and the trainer waits only when the servers are slower than k
training steps. k = 0 is the synchronous path of :class:`RolloutCallback` (no thread).

The pipeline is not saved in checkpoints: a resumed run starts it afresh from the restored
weights, so no sample drawn before the checkpoint trains after it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from ..rollout.base import Rollout, RolloutEngine, SamplingConfig


class VersionRecorder(RolloutEngine):
    """Wraps an engine and records the weight version of every sample it returns (engines that
    report versions, such as :class:`~lightning_grpo.rollout.server_engine.ServerEngine`)."""

    def __init__(self, engine: RolloutEngine) -> None:
        self.engine = engine
        self.versions: list[int] = []
        self.needs_weight_sync = engine.needs_weight_sync
        self.max_model_len = engine.max_model_len
        self.dtype = engine.dtype

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig, seed: int) -> Rollout:
        rollout = self.engine.generate(prompt_ids, sampling, seed)
        self.versions.extend(rollout.versions or [])
        return rollout

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int | None = None) -> None:
        self.engine.load_weights(weights, version=version)

    def score(self, sequences: list[list[int]]) -> dict[str, list[torch.Tensor]]:
        return self.engine.score(sequences)

    def metrics(self) -> dict[str, float]:
        """``weight_version_min`` / ``weight_version_mean`` of what was sampled (empty without versions)."""
        if not self.versions:
            return {}
        return {
            "weight_version_min": float(min(self.versions)),
            "weight_version_mean": sum(self.versions) / len(self.versions),
        }


def staleness_metrics(metrics: dict[str, float], step: int, limit: int | None) -> dict[str, float]:
    """``staleness_max`` / ``staleness_mean`` (optimizer steps between the sampling weights and the
    trainer's at ``step``); raise if a batch is staler than ``limit`` (a pipeline bug, never expected)."""
    if "weight_version_min" not in metrics:
        return {}
    worst = step - metrics["weight_version_min"]
    if limit is not None and worst > limit:
        raise RuntimeError(
            f"a rollout batch sampled with weight version {metrics['weight_version_min']:.0f} would train at step "
            f"{step}: staleness {worst:.0f} > max_staleness {limit}"
        )
    return {"staleness_max": worst, "staleness_mean": step - metrics["weight_version_mean"]}


class AsyncRollout:
    """Runs weight pushes and generations on one background thread, up to ``max_staleness`` ahead.

    Args:
        max_staleness: k >= 1.
        steps_per_generation: P, optimizer steps fed by one generation batch.
        prepare_push: ``(step) -> payload``: snapshot the policy's weights now (main thread).
        send_push: ``(payload, step) -> None``: hand the snapshot to the engine (worker thread).
        sample: ``(generation) -> result``: sample and score one generation batch (worker thread).
    """

    def __init__(
        self,
        max_staleness: int,
        steps_per_generation: int,
        prepare_push: Callable[[int], Any],
        send_push: Callable[[Any, int], None],
        sample: Callable[[int], Any],
    ) -> None:
        if max_staleness < 1:
            raise ValueError(f"AsyncRollout needs max_staleness >= 1, got {max_staleness}")
        self.max_staleness = max_staleness
        self.per_gen = steps_per_generation
        self._prepare_push, self._send_push, self._sample = prepare_push, send_push, sample
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lightning-grpo-rollout")
        self._batches: dict[int, Future] = {}  # generation -> Future[result]
        self._pushed = -1  # newest weight version queued for push
        self._push_seconds: list[float] = []
        self._pushes: list[Future] = []  # queued pushes; their errors surface at the next batch

    def _ensure_pushed(self, step: int) -> None:
        if self._pushed < step:
            payload = self._prepare_push(step)
            self._pushes.append(self._worker.submit(self._timed_push, payload, step))
            self._pushed = step

    def _timed_push(self, payload: Any, step: int) -> None:
        start = time.perf_counter()
        self._send_push(payload, step)
        self._push_seconds.append(time.perf_counter() - start)

    def next_batch(self, generation: int, step: int) -> tuple[Any, dict[str, float]]:
        """The result of ``generation`` (waits for it) after queueing the push of version ``step``
        and every generation the staleness bound allows; returns (result, phase times)."""
        newest = (step + self.max_staleness) // self.per_gen
        to_queue = [h for h in range(generation, newest + 1) if h not in self._batches]
        if to_queue:
            self._ensure_pushed(step)
            for h in to_queue:
                self._batches[h] = self._worker.submit(self._sample, h)
        start = time.perf_counter()
        future = self._batches.pop(generation)
        future.exception()  # wait; every push queued before this batch is done now
        self._raise_failed_pushes()
        result = future.result()
        times = {"time/wait_rollout": time.perf_counter() - start, "time/sync": sum(self._push_seconds)}
        self._push_seconds.clear()
        return result, times

    def _raise_failed_pushes(self) -> None:
        done = [f for f in self._pushes if f.done()]
        self._pushes = [f for f in self._pushes if not f.done()]
        for f in done:
            f.result()

    def call(self, step: int, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the worker after the queued work, with the weights of version ``step`` (validation)."""
        self._ensure_pushed(step)
        future = self._worker.submit(fn)
        future.exception()
        self._raise_failed_pushes()
        return future.result()

    def close(self) -> None:
        """Drop queued generations and stop the worker (waits for the one running, if any)."""
        for future in self._batches.values():
            future.cancel()
        self._batches.clear()
        self._worker.shutdown(wait=True, cancel_futures=True)
