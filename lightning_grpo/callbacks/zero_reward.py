"""ZeroRewardGuard: every reward of the run's first generation batches is 0, so nothing can be learned.

A reward that never pays is most often a setup mistake, not a hard task: the reward compares the answer with
a value of another type, reads another column, extracts the answer in a format the completions never write,
or the completions are cut off before the answer. The guard says so once, naming those causes with what the
run shows of each (the reward functions, the answer column and its first value, the share of cut-off
completions). See `lightning_grpo.callbacks.guards` for the actions and the alarm records.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from typing_extensions import override

from ..core.batch import RolloutBatch
from ..data.datamodule import PromptDataModule
from .guards import Action, Guard
from .lookup import find_callback
from .rollout import RolloutCallback

#: Generation batches at the start of a run whose rewards must all be 0 before ZeroRewardGuard fires.
ZERO_REWARD_BATCHES = 10


def all_rewards_zero(metrics: dict[str, float]) -> bool:
    """Whether one generation batch's statistics show every reward at 0: the total's mean, min, max and std,
    and each reward function's mean and std (``reward/<fn>/mean``, ``/std``), whichever were logged."""
    keys = ("reward_mean", "reward_std", "reward_min", "reward_max")
    values = [metrics[k] for k in keys if k in metrics]
    values += [v for k, v in metrics.items() if k.startswith("reward/") and k.endswith(("/mean", "/std"))]
    return bool(values) and all(v == 0 for v in values)


class ZeroRewardGuard(Guard):
    """Every reward (all samples, all reward functions) was 0 in each of the run's first ``steps`` generation
    batches: warns once, naming the likeliest causes (the answer's type, the reward function or the column it
    reads, the answer's format, truncation). A batch with any reward other than 0 ends the watch for the run.

    Args:
        steps: the first generation batches that must all score 0 before it fires.
        action: "warn" logs the alarm, "skip" drops the optimizer step, "stop" ends the run.
    """

    name = "zero_reward"
    SETTINGS = ("steps",)

    def __init__(self, steps: int = ZERO_REWARD_BATCHES, action: Action = "warn") -> None:
        super().__init__(action)
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"ZeroRewardGuard.steps must be an integer >= 1, got {steps!r}")
        self.steps = steps
        self.zero_batches = 0  # batches so far, all at reward 0
        self.done = False  # a batch paid something, or the guard fired: it watches no more

    def on_rollout_end(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: RolloutBatch) -> None:
        metrics = pl_module.rollout_metrics
        if self.done or "reward_mean" not in metrics:
            return
        self.zero_batches = self.zero_batches + 1 if all_rewards_zero(metrics) else 0
        self.done = self.zero_batches == 0 or self.zero_batches >= self.steps
        if self.zero_batches < self.steps:
            self.clear(trainer, pl_module)
            return
        self.fire(trainer, pl_module, self._message(trainer, metrics))

    def _message(self, trainer: L.Trainer, metrics: dict[str, float]) -> str:
        rollout = find_callback(trainer, RolloutCallback, required=False)
        names = rollout.reward_set.names if rollout is not None else _names(metrics)
        rewards = ", ".join(map(repr, names)) or "the reward functions"
        causes = [
            f"the answer's type: answers reach the rewards as text ({_answers(trainer)}), a reward comparing "
            "numbers never matches",
            f"the reward function or its column: {rewards} is not the one meant, or reads another column",
            "the completions never write the answer in the format the reward extracts (see completions.jsonl)",
        ]
        share = metrics.get("truncation_ratio")
        if share is None or share > 0:
            budget, option = (
                (None, "rollout.sampling.max_new_tokens") if rollout is None else rollout.completion_budget()
            )
            limit = "the length limit" if budget is None else f"max_new_tokens={budget}"
            cut = "completions" if share is None else f"{share:.0%} of completions"
            causes.append(f"truncation: {cut} hit {limit} (raise {option})")
        listed = "; ".join(f"({i}) {c}" for i, c in enumerate(causes, start=1))
        batches = f"{self.zero_batches} generation batch{'es' if self.zero_batches > 1 else ''}"
        return (
            f"every reward was 0 in the first {batches} (all samples, all reward functions): nothing is learned. "
            f"Likeliest causes: {listed}. Score a right completion by hand to tell which"
        )

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"zero_batches": self.zero_batches, "done": self.done}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.zero_batches = int(state_dict.get("zero_batches", 0))
        self.done = bool(state_dict.get("done", False))


def _names(metrics: dict[str, float]) -> list[str]:
    """The reward functions' names in logged metrics (``reward/<name>/mean``)."""
    return [k[len("reward/") : -len("/mean")] for k in metrics if k.startswith("reward/") and k.endswith("/mean")]


def _answers(trainer: L.Trainer) -> str:
    """Which column the answers come from and the first one, as the data module holds them."""
    data = getattr(trainer, "datamodule", None)  # a Lightning Trainer (third-party), or a test's stand-in
    column = data.format.answer_column if isinstance(data, PromptDataModule) else "answer"
    if column is None:
        return "data.format.answer_column is null: the records hold no answer"
    records = (data.train_records if isinstance(data, PromptDataModule) else None) or [{}]
    first = records[0].get("answer")
    return f"data.format.answer_column: {column}" + (f", the first {first!r}" if first is not None else "")
