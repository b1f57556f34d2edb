"""Per-optimizer-step metrics, exact across micro-batches and ranks (torchmetrics), and the
rollout statistics reduced over ranks.

An optimizer step may span several micro-batches (``accumulate_grad_batches``, or a mini-batch
split in ``steps_per_generation``) and several ranks. Logging each micro-batch's own values
would report the last micro-batch only; :class:`StepMetrics` accumulates them instead:

- ``loss``: a sum (each micro-batch's loss is already its share of the global normaliser);
- ``ratio_min``: a minimum; ``ratio_max``, ``mismatch_max_abs``: maxima;
- every other metric: a token-weighted mean (the metrics of :class:`~lightning_grpo.core.GRPOLoss`
  are means over a micro-batch's valid tokens), so the step value equals the value over the
  whole step's tokens.

``compute()`` synchronises across ranks (torchmetrics' ``dist_sync``) and is called by every rank
at the same point (``GRPOModule.on_before_optimizer_step``). NaN values propagate (a NaN loss must
show in the logs, not be dropped).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torch import Tensor
from torchmetrics import MaxMetric, MeanMetric, Metric, MinMetric, SumMetric

SUMS = frozenset({"loss"})
MINIMA = frozenset({"ratio_min"})
MAXIMA = frozenset({"ratio_max", "mismatch_max_abs"})


#: NaN in, NaN out. (A float strategy replaces NaN by itself; torchmetrics' "disable" would also
#: drop MeanMetric's weights, and "warn" / "ignore" would hide a NaN loss.)
KEEP_NAN = float("nan")


def _new_metric(name: str) -> Metric:
    if name in SUMS:
        return SumMetric(nan_strategy=KEEP_NAN)
    if name in MINIMA:
        return MinMetric(nan_strategy=KEEP_NAN)
    if name in MAXIMA:
        return MaxMetric(nan_strategy=KEEP_NAN)
    return MeanMetric(nan_strategy=KEEP_NAN)


class StepMetrics:
    """Accumulates loss metrics over the micro-batches of one optimizer step (all ranks)."""

    def __init__(self) -> None:
        self._metrics: dict[str, Metric] = {}
        self._cache: dict[str, float] | None = None

    def update(self, metrics: dict[str, Tensor], tokens: Tensor) -> None:
        """Add one micro-batch's metrics (scalars) computed over ``tokens`` valid tokens."""
        for name, value in metrics.items():
            metric = self._metric(name, value.device)
            if float(tokens) <= 0:  # nothing was measured: min / max / mean would be meaningless
                continue
            value = value.detach().float()
            if isinstance(metric, MeanMetric):
                metric.update(value, weight=tokens.to(value))
            else:
                metric.update(value)
        self._cache = None

    def compute(self) -> dict[str, float]:
        """The step's values (synchronised across ranks; cached until the next update / reset)."""
        if self._cache is None:
            self._agree_on_names()
            self._cache = {name: _to_float(metric.compute()) for name, metric in sorted(self._metrics.items())}
        return self._cache

    def _metric(self, name: str, device: torch.device) -> Metric:
        metric = self._metrics.get(name)
        if metric is None:
            metric = self._metrics[name] = _new_metric(name).to(device)
        return metric

    def _agree_on_names(self) -> None:
        """Every rank must compute (and so synchronise) the same metrics in the same order: a rank
        whose micro-batches were empty may not have seen some of them."""
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return
        names: list[list[str]] = [[] for _ in range(dist.get_world_size())]
        dist.all_gather_object(names, sorted(self._metrics))
        device = next(iter(self._metrics.values())).device if self._metrics else torch.device("cpu")
        for name in {n for rank_names in names for n in rank_names}:
            self._metric(name, device)

    def reset(self) -> None:
        for metric in self._metrics.values():
            metric.reset()
        self._cache = None


def _to_float(value: Tensor) -> float:
    value = float(value)
    return value if not math.isinf(value) else float("nan")  # an un-updated min / max: nothing seen


def total_grad_norm(parameters) -> Tensor:
    """L2 norm over all gradients (NaN / inf when any gradient is non-finite); 0 when there are none."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.detach().float()) for g in grads]))


def hands_step_metrics_over(trainer: Any) -> bool:
    """Whether this optimizer step's metrics go to ``LightningModule.log`` (call before the step's update).

    Each value handed to ``self.log`` costs about a millisecond (Lightning moves the metric's state to the
    value's device), and a step logs some 60: a fifth of a tiny model's CPU step. So the step metrics are
    handed over on the steps whose metrics the loggers write (every ``Trainer(log_every_n_steps)``-th), on the
    run's last step (``trainer.callback_metrics`` holds the final values after ``fit``), on a step at which
    the run stops, and on every step of ``fast_dev_run``. In between, ``trainer.callback_metrics`` keeps the
    last handed-over values; ``Trainer(log_every_n_steps=1)`` hands every step over. Purely local: no
    collective, so ranks may differ (a guard stopping one rank only)."""
    step = trainer.global_step + 1  # this step, counted from 1 (Lightning's rule for log_every_n_steps)
    every = trainer.log_every_n_steps
    last_step = 0 < trainer.max_steps <= step
    last_epoch = trainer.max_epochs is not None and 0 < trainer.max_epochs <= trainer.current_epoch + 1
    return bool(
        trainer.fast_dev_run
        or trainer.should_stop
        or (every > 0 and step % every == 0)
        or last_step
        or (last_epoch and trainer.is_last_batch)
    )


def reduce_rollout_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Every rank's rollout statistics combined (call on every rank of the default process group).

    Every rank samples the same number of prompts, so a mean over ranks is the global mean:
    ``*_min`` take the minimum, ``*_max`` and the phase times ``time/*`` the maximum (the step
    waits for the slowest rank), everything else the mean over the ranks that logged it (a key
    such as ``reward/<fn>/timeout`` may exist on some ranks only).
    """
    dist = torch.distributed
    gathered: list[dict[str, float]] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(gathered, {k: float(v) for k, v in metrics.items()})
    out: dict[str, float] = {}
    for key in sorted({k for rank in gathered for k in rank}):
        values = [rank[key] for rank in gathered if key in rank]
        if key.endswith("_min"):
            out[key] = min(values)
        elif key.endswith("_max") or key.startswith("time/"):
            out[key] = max(values)
        else:
            out[key] = sum(values) / len(values)
    return out


#: Lightning's advice to log with ``sync_dist=True``, for the module's ``val/*`` and ``test/*`` metrics.
SYNC_ADVICE = r"It is recommended to use `self\.log\('(val|test)/"


def quiet_sync_advice(world_size: int) -> None:
    """Filter :data:`SYNC_ADVICE` in a one-process run. The module logs its evaluation metrics with
    ``sync_dist=True``; with one process Lightning turns that off (there is nothing to reduce) but,
    when a process group exists (the in-process vLLM engine creates one), still advises it once per
    metric at every validation. Runs of several processes keep the advice."""
    if world_size == 1:
        warnings.filterwarnings("ignore", message=SYNC_ADVICE)
