"""Guards on the reward's course over many steps: reward hacking (the training reward rises, the
held-out reward does not) and length blow-up (completions grow, the reward does not), which seed
000 names in its introduction, and a learned behaviour lost (the reward falls back to where it
began; docs/guide/stability.md). See `lightning_grpo.callbacks.guards` for the actions and alarm
records; all three warn by default and have no automatic remedy.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import lightning as L
from typing_extensions import override

from ..core.batch import RolloutBatch
from .guards import Action, Guard


def _reward(metrics: dict[str, float], name: str | None) -> float | None:
    """The rollout's mean reward: the weighted total (``name`` None) or one reward function's."""
    value = metrics.get("reward_mean" if name is None else f"reward/{name}/mean")
    return value if value is not None and math.isfinite(value) else None


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


class RewardHackingGuard(Guard):
    """The training reward rises while the held-out reward stays flat: the policy exploits
    something the training prompts pay for that does not generalise (a loophole in the reward,
    memorised prompts, a train / held-out mismatch).

    At each validation the guard records the mean training reward since the previous one and the
    held-out ``val/reward_mean``; over the last ``window`` validations it fires when the training
    reward rose by at least ``min_train_rise`` and the held-out reward by less than
    ``max_heldout_share`` of that rise. Needs validation (``val_check_interval``).

    Args:
        window: validations compared.
        min_train_rise: the training reward's rise over the window that counts.
        max_heldout_share: fire when the held-out reward rose by less than this share of the training rise.
        action: "warn" logs the alarm, "skip" drops the optimizer step, "stop" ends the run.
    """

    name = "reward_hacking"
    CHECKS_AT_VALIDATION = True
    SETTINGS = ("window", "min_train_rise", "max_heldout_share")
    KNOBS = (
        "compare the completions that score on the training prompts with the held-out ones: tighten the "
        "reward (format-only credit, a parser loophole), deduplicate training prompts, check that the "
        "held-out split follows the same rules"
    )

    def __init__(
        self, window: int = 3, min_train_rise: float = 0.1, max_heldout_share: float = 0.25, action: Action = "warn"
    ) -> None:
        super().__init__(action)
        if window < 2:
            raise ValueError(f"RewardHackingGuard.window must be >= 2 (validations compared), got {window}")
        if not (min_train_rise > 0 and max_heldout_share >= 0):
            raise ValueError(
                f"RewardHackingGuard.min_train_rise must be > 0 and max_heldout_share >= 0, got {min_train_rise}, {max_heldout_share}"
            )
        self.window, self.min_train_rise, self.max_heldout_share = window, min_train_rise, max_heldout_share
        self._since_validation: list[float] = []
        self.train: deque[float] = deque(maxlen=window)
        self.heldout: deque[float] = deque(maxlen=window)

    def on_rollout_end(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: RolloutBatch) -> None:
        reward = _reward(pl_module.rollout_metrics, None)
        if reward is not None:
            self._since_validation.append(reward)

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        heldout = trainer.callback_metrics.get("val/reward_mean")
        if trainer.sanity_checking or heldout is None or not self._since_validation:
            return
        self.train.append(_mean(self._since_validation))
        self.heldout.append(float(heldout))
        self._since_validation = []
        if len(self.train) < self.window:
            return
        train_rise, heldout_rise = self.train[-1] - self.train[0], self.heldout[-1] - self.heldout[0]
        if train_rise < self.min_train_rise or heldout_rise >= self.max_heldout_share * train_rise:
            self.clear(trainer, pl_module)
            return
        message = (
            f"training reward rose {self.train[0]:.3g} -> {self.train[-1]:.3g} over the last {self.window} validations "
            f"while the held-out reward went {self.heldout[0]:.3g} -> {self.heldout[-1]:.3g}: reward hacking or "
            f"overfitting; {self.KNOBS}"
        )
        self.fire(trainer, pl_module, message)


class LengthGuard(Guard):
    """Mean completion length grows while the reward does not: length blow-up, from a
    reward that pays for length or a loss that favours long wrong answers (Dr.GRPO's length bias
    of ``seq_mean_token_mean``).

    Over the last ``window`` generation batches it compares the first and the last quarter: fires
    when ``completion_length_mean`` grew by ``rise_factor`` (and by at least ``min_tokens``) while
    the reward gained less than ``min_reward_gain``. ``reward`` names the reward function to
    watch (e.g. the accuracy reward when a length bonus is part of the total); None = the total.

    Args:
        window: generation batches compared (first quarter against last quarter).
        rise_factor: the growth of the mean completion length that counts.
        min_tokens: the least growth in tokens that counts.
        min_reward_gain: fire only while the reward gained less than this.
        reward: the reward function to watch (None: the total).
        action: "warn" logs the alarm, "skip" drops the optimizer step, "stop" ends the run.
    """

    name = "length"
    SETTINGS = ("window", "rise_factor", "min_tokens", "min_reward_gain", "reward")
    KNOBS = (
        "a length-neutral aggregation (token_mean, or seq_mean_token_sum_norm: Dr.GRPO), a length penalty "
        "(rewards: soft_overlong) or rollout.selection.overlong_filter, and check that no reward pays for length"
    )

    def __init__(
        self,
        window: int = 50,
        rise_factor: float = 1.5,
        min_tokens: float = 1.0,
        min_reward_gain: float = 0.05,
        reward: str | None = None,
        action: Action = "warn",
    ) -> None:
        super().__init__(action)
        if window < 4:
            raise ValueError(f"LengthGuard.window must be >= 4 (its quarters are compared), got {window}")
        if not rise_factor > 1:
            raise ValueError(f"LengthGuard.rise_factor must be > 1, got {rise_factor}")
        self.window, self.rise_factor, self.min_tokens = window, rise_factor, min_tokens
        self.min_reward_gain, self.reward = min_reward_gain, reward
        self.lengths: deque[float] = deque(maxlen=window)
        self.rewards: deque[float] = deque(maxlen=window)

    def on_rollout_end(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: RolloutBatch) -> None:
        metrics = pl_module.rollout_metrics
        length, reward = metrics.get("completion_length_mean"), _reward(metrics, self.reward)
        if length is None or reward is None:
            return
        self.lengths.append(length)
        self.rewards.append(reward)
        if len(self.lengths) < self.window:
            return
        q = self.window // 4
        first, last = _mean(list(self.lengths)[:q]), _mean(list(self.lengths)[-q:])
        gain = _mean(list(self.rewards)[-q:]) - _mean(list(self.rewards)[:q])
        if last < self.rise_factor * first or last - first < self.min_tokens or gain >= self.min_reward_gain:
            self.clear(trainer, pl_module)
            return
        what = "reward" if self.reward is None else f"reward {self.reward}"
        message = (
            f"completion length grew {first:.3g} -> {last:.3g} tokens over the last {self.window} batches while the "
            f"{what} changed by {gain:+.3g}: length blow-up; {self.KNOBS}"
        )
        self.fire(trainer, pl_module, message)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"lengths": list(self.lengths), "rewards": list(self.rewards)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.lengths = deque(state_dict["lengths"], maxlen=self.window)
        self.rewards = deque(state_dict["rewards"], maxlen=self.window)


class RewardDropGuard(Guard):
    """A learned behaviour lost: the training reward falls back most of the way to where it began
    (docs/guide/stability.md, "A learned behaviour lost in one step": a tool call learned for 300 steps
    and gone after one ordinary optimizer step).

    The guard follows the mean reward of the last ``window`` generation batches. ``start`` is the
    first full window's mean, ``best`` the highest since. Once the run has gained at least
    ``min_gain`` (``best - start``, in the reward's units) it fires while the window's mean has
    lost ``drop`` of that gain or more: ``mean <= best - drop * (best - start)``. ``reward`` names
    the reward function to watch (None = the weighted total). Its state is kept in checkpoints,
    so a resumed run compares with the best of the whole run.

    Args:
        window: generation batches averaged.
        drop: the share of the gain lost that fires it.
        min_gain: the gain (best - start) the run must have made first.
        reward: the reward function to watch (None: the weighted total).
        action: "warn" logs the alarm, "skip" drops the optimizer step, "stop" ends the run.

    Example:
        ```python
        from lightning_grpo import RewardDropGuard

        guard = RewardDropGuard(window=20, drop=0.5, reward="env_reward", action="stop")
        ```
    """

    name = "reward_drop"
    SETTINGS = ("window", "drop", "min_gain", "reward")

    def __init__(
        self,
        window: int = 20,
        drop: float = 0.5,
        min_gain: float = 0.1,
        reward: str | None = None,
        action: Action = "warn",
    ) -> None:
        super().__init__(action)
        if window < 1:
            raise ValueError(f"RewardDropGuard.window must be >= 1, got {window}")
        if not 0 < drop <= 1:
            raise ValueError(f"RewardDropGuard.drop must be in (0, 1] (the share of the gain lost), got {drop}")
        if not min_gain > 0:
            raise ValueError(f"RewardDropGuard.min_gain must be > 0, got {min_gain}")
        self.window, self.drop, self.min_gain, self.reward = window, drop, min_gain, reward
        self.rewards: deque[float] = deque(maxlen=window)
        self.start: float | None = None
        self.best: float | None = None
        self.best_step = 0

    def on_rollout_end(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: RolloutBatch) -> None:
        reward = _reward(pl_module.rollout_metrics, self.reward)
        if reward is None:
            return
        self.rewards.append(reward)
        if len(self.rewards) < self.window:
            return
        mean = _mean(self.rewards)
        if self.start is None:
            self.start = self.best = mean
        if mean > self.best:
            self.best, self.best_step = mean, trainer.global_step
        gain = self.best - self.start
        if gain < self.min_gain or mean > self.best - self.drop * gain:
            self.clear(trainer, pl_module)
            return
        what = "training reward" if self.reward is None else f"training reward {self.reward}"
        message = (
            f"{what} fell to {mean:.3g} (mean of the last {self.window} batches) from its best {self.best:.3g} at step "
            f"{self.best_step}, having started at {self.start:.3g}: {(self.best - mean) / gain:.0%} of the gain is gone. "
            f"A behaviour the policy had learned may be lost: compare this step's completions with those before step "
            f"{self.best_step}, and resume from a checkpoint written before the drop (--ckpt_path) rather than train on"
        )
        self.fire(trainer, pl_module, message)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"rewards": list(self.rewards), "start": self.start, "best": self.best, "best_step": self.best_step}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.rewards = deque(state_dict["rewards"], maxlen=self.window)
        self.start, self.best, self.best_step = state_dict["start"], state_dict["best"], state_dict["best_step"]
