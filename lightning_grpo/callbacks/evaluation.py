"""Held-out evaluation: greedy accuracy, and pass@k / mean@n over n sampled completions per prompt.

With n samples of a prompt of which c pass, the unbiased estimator of pass@k (Chen et al. 2021,
"Evaluating Large Language Models Trained on Code", eq. 1) is

    pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n - c + 1}^{n} (1 - k / i)

(the product form avoids huge binomials), averaged over the prompts; mean@n is the mean score of
the n samples (its pass / fail version equals pass@1). A sample passes when the first reward
function scores it at least ``threshold`` (1.0: full marks of a 0 / 1 accuracy reward).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from torch import Tensor
from typing_extensions import override

from ..rollout.base import SamplingConfig, derive_seed, test_seed
from .sampling import score_rollout


def pass_at_k(correct: Tensor, n: int, k: int) -> Tensor:
    """[P] unbiased pass@k of each prompt from its number of passing samples ``correct`` [P] out of ``n``."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n (samples per prompt), got k={k}, n={n}")
    correct = correct.to(torch.float64)
    out = torch.ones_like(correct)  # n - c < k: every draw of k holds a pass
    for p in range(correct.numel()):
        c = int(correct[p])
        if n - c >= k:
            i = torch.arange(n - c + 1, n + 1, dtype=torch.float64)  # [c]
            out[p] = 1.0 - torch.prod(1.0 - k / i)
    return out


def evaluate_prompts(
    engine,
    reward_set,
    tokenizer,
    records,
    sampling: SamplingConfig,
    samples: int,
    seed: int,
    pass_k: list[int] | None = None,
    threshold: float = 1.0,
    split: str = "val",
) -> dict[str, float]:
    """Greedy accuracy (mean of the first reward function under greedy decoding); with ``samples``
    = n > 0 also the mean total reward of n sampled completions per prompt (``val/reward_mean``),
    ``val/mean@n`` (mean first reward) and ``val/pass@k`` for each k of ``pass_k`` (default: n). With several
    reward functions, each one's mean apart: ``val/greedy/<name>`` and ``val/mean@n/<name>``.
    ``split`` prefixes the names (``"test"``: ``test/greedy_accuracy``, ...)."""
    prompt_ids = [r["prompt_ids"] for r in records]
    greedy = engine.generate(
        prompt_ids, SamplingConfig(n=1, temperature=0.0, max_new_tokens=sampling.max_new_tokens), seed
    )
    scores = score_rollout(greedy, reward_set, tokenizer, records)
    out = {"greedy_accuracy": scores.rewards[:, 0].mean().item(), **_each_reward(scores, "greedy")}
    if samples > 0:
        cfg = SamplingConfig(
            n=samples,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            max_new_tokens=sampling.max_new_tokens,
        )
        sampled = score_rollout(engine.generate(prompt_ids, cfg, seed), reward_set, tokenizer, records)
        out["reward_mean"] = (sampled.rewards @ sampled.weights).mean().item()
        first = sampled.rewards[:, 0].view(len(records), samples)  # [P, n]
        out[f"mean@{samples}"] = first.mean().item()
        out.update(_each_reward(sampled, f"mean@{samples}"))
        correct = (first >= threshold).sum(-1)  # [P]
        for k in pass_k or [samples]:
            out[f"pass@{k}"] = pass_at_k(correct, samples, k).mean().item()
    return {f"{split}/{name}": value for name, value in out.items()}


def _each_reward(scores, what: str) -> dict[str, float]:
    """``{what}/{name}``: each reward function's mean over the samples it scored, when there are several (a
    strict and a lenient reading of the answer are then reported apart)."""
    if len(scores.names) < 2:
        return {}
    means = scores.metrics(prefix=f"{what}/")
    return {key.removesuffix("/mean"): value for key, value in means.items() if key.endswith("/mean")}


class HeldOutEvaluation:
    """The held-out evaluation of :class:`~lightning_grpo.callbacks.rollout.RolloutCallback`: the callback's own
    ``on_validation_batch_end`` / ``on_test_batch_end`` call `evaluate` (and ``on_train_start``, for the untrained
    policy's metrics at step 0), which samples the records on the callback's
    engine with the seed of the batch being evaluated, and log its metrics through the module. Reads the callback's
    engine, rewards, sampling and evaluation settings, sampling seed and generation step (its asynchronous pipeline)."""

    _eval_batch: int  # the index of the validation / test batch being evaluated (test batches' seeds)
    sampling_seed: int
    reward_set: Any
    sampling: SamplingConfig
    evaluation: Any  # callbacks.settings.EvaluationSettings
    generation: Any  # callbacks.generation.GenerationStep: its asynchronous pipeline, or None
    ensure_engine: Callable[..., Any]  # (trainer, module) -> the engine, built on first use
    sync_weights: Callable[..., float]  # (module) -> seconds of the push

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
    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._eval_batch = batch_idx

    @override
    def on_test_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._eval_batch = batch_idx

    @override
    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._log_held_out(pl_module, batch, "val")

    @override
    def on_test_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._log_held_out(pl_module, batch, "test")

    def _log_held_out(self, module: L.LightningModule, records: list[dict], split: str) -> None:
        """`evaluate` a batch of held-out records and log its metrics, averaged over the batches and ranks."""
        metrics = self.evaluate(module, records, split)
        module.log_dict(metrics, on_step=False, on_epoch=True, batch_size=len(records), sync_dist=True)

    def eval_seed(self, module: L.LightningModule, split: str) -> int:
        """The seed of the held-out batch being evaluated: a dev (``val``) check draws from the run seed + 1 at
        the optimizer step; a test batch from `test_seed` (never a
        training generation's seed, and the same whatever checkpoint is tested)."""
        rank = module.trainer.global_rank
        if split == "test":
            return test_seed(self.sampling_seed, rank, self._eval_batch)
        return derive_seed(self.sampling_seed + 1, rank, module.trainer.global_step)

    def evaluate(self, module: L.LightningModule, records: list[dict], split: str = "val") -> dict[str, float]:
        """Held-out metrics (``<split>/...``) of a batch of prompt records (``split="val"``: the dev split, from the
        validation hooks; ``"test"`` from the test hooks)."""
        trainer = module.trainer
        engine = self.ensure_engine(trainer, module)
        seed = self.eval_seed(module, split)
        settings = self.evaluation
        args = (
            engine,
            self.reward_set,
            trainer.datamodule.tokenizer,
            records,
            self.sampling,
            settings.samples,
            seed,
            settings.pass_k,
            settings.pass_threshold,
            split,
        )
        pipeline = self.generation.pipeline
        if pipeline is not None:  # the worker owns the servers: queue behind its work
            return pipeline.call(trainer.global_step, lambda: evaluate_prompts(*args))
        self.sync_weights(module)
        metrics = evaluate_prompts(*args)
        engine.sleep()
        return metrics
