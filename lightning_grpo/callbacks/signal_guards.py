"""Guards on the learning signal: identical samples, zero reward spread, cut-off completions,
rollout/trainer drift.

See `lightning_grpo.callbacks.guards` for the actions and the alarm records.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import lightning as L
import torch
from torch import Tensor
from typing_extensions import override

from ..core import CORRECTIONS, GRPOLoss
from ..core.batch import RolloutBatch
from ..training.module import GRPOModule
from .guards import Action, Guard, log
from .lookup import find_callback
from .rollout import RolloutCallback


def improbable_identical_groups(batch: RolloutBatch, max_chance: float) -> Tensor:
    """[P] bool: the group's G completions are token-identical although the sampler gave that
    completion probability p with p ** (G - 1) < ``max_chance`` (the chance that G independent
    draws repeat it). A confident policy repeating its answer is not flagged; a group whose
    samples share one random stream is."""
    G = batch.group_size
    P = len(batch) // G
    mask = batch.completion_mask  # [B, T]
    T = mask.shape[1]
    tokens = (batch.input_ids[:, -T:] * (mask > 0)).view(P, G, T)  # [P, G, T]; padding as 0
    lengths = (mask > 0).sum(-1).view(P, G)  # [P, G]
    identical = (tokens == tokens[:, :1]).all(-1).all(-1) & (lengths == lengths[:, :1]).all(-1)  # [P]
    seq_logp = (batch.rollout_logp * mask).sum(-1).view(P, G)[:, 0]  # [P] log p of the first sample
    chance = torch.exp((G - 1) * seq_logp.double())  # [P]
    return identical & (chance < max_chance)


class IdenticalSamplesGuard(Guard):
    """A group's samples are token-identical at temperature > 0 (a seeding bug): reward std and the
    loss are zero, nothing is learned. Fires when at least ``threshold`` of the groups are
    identical *and* improbable under the sampler's own log-probs (see
    `improbable_identical_groups`); the likely cause is seeding.

    Args:
        threshold: the fraction of identical, improbable groups that fires it, in (0, 1].
        max_chance: a group counts when the sampler's log-probs give its repeat a chance below this.
        action: "warn" logs the alarm, "skip" drops the optimizer step, "stop" ends the run.
    """

    name = "identical_samples"
    SETTINGS = ("threshold", "max_chance")

    def __init__(self, threshold: float = 0.25, max_chance: float = 1e-4, action: Action = "warn") -> None:
        super().__init__(action)
        if not 0 < threshold <= 1:
            raise ValueError(f"IdenticalSamplesGuard.threshold must be in (0, 1], got {threshold}")
        self.threshold, self.max_chance = threshold, max_chance

    def on_rollout_end(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: RolloutBatch) -> None:
        if batch.temperature <= 0 or batch.group_size < 2:
            return
        flagged = improbable_identical_groups(batch, self.max_chance)  # [P]
        frac = flagged.float().mean().item()
        if frac < self.threshold:
            self.clear(trainer, pl_module)
            return
        message = (
            f"{int(flagged.sum())}/{len(flagged)} groups have {batch.group_size} token-identical completions at "
            f"temperature {batch.temperature:g} although the sampler's log-probs make a repeat unlikely "
            f"(< {self.max_chance:g}); likely cause: the samples of a group share one random seed (seeding: every "
            "sample needs its own seed / generator), or a sampler that ignores the temperature"
        )
        self.fire(trainer, pl_module, message)


class ZeroStdGuard(Guard):
    """Groups whose samples all got the same reward (``train/frac_reward_zero_std``) have zero
    advantages and teach nothing. Fires when the fraction, averaged over the last ``window``
    generation batches (once there are that many), reaches ``threshold``; with ``max_reward`` set,
    not while the reward mean over the same window has reached it (the groups are all-right: the
    task is learned).

    A pass / fail reward (two distinct values in some batch of the window and never more, e.g.
    exact match of a one-digit answer) makes zero-std groups a property of the task: a prompt solved with
    probability p gives an all-equal group of G with probability p^G + (1 - p)^G (0.51 at p = 0.08,
    G = 8): all-wrong groups dominate a cold start, all-right groups a learned task. The guard
    says so once (at its first full window) and from then on counts only the groups without
    signal that are not learned, those whose every sample got the batch's lowest reward
    (``train/frac_groups_all_lowest``); it fires when they reach ``pass_fail_threshold`` (the
    prompts are too hard, the reward never pays). None: ``threshold`` on all zero-std groups.

    ``action="fix"``: switch on dynamic sampling (`RolloutCallback.set_dynamic_sampling`);
    if it is on, raise the sampling temperature by ``temperature_step`` up to
    ``max_temperature``; then warn. The window starts afresh after each fix.

    Args:
        threshold: the fraction of zero-std groups, averaged over `window`, that fires it.
        max_reward: stay quiet while the window's reward mean has reached this (None: never).
        window: generation batches averaged.
        pass_fail_threshold: for a pass / fail reward, the fraction of all-lowest groups that fires it (None: use `threshold`).
        action: "warn" logs the alarm, "skip" drops the optimizer step, "stop" ends the run, "fix" switches on dynamic sampling, then raises the temperature.
        max_temperature: the highest temperature "fix" sets.
        temperature_step: how much "fix" raises the temperature at a time.
    """

    name = "zero_reward_std"
    SETTINGS = ("threshold", "max_reward", "window", "pass_fail_threshold", "max_temperature")

    def __init__(
        self,
        threshold: float = 0.75,
        max_reward: float | None = None,
        window: int = 20,
        pass_fail_threshold: float | None = 0.95,
        action: Action = "warn",
        max_temperature: float = 1.2,
        temperature_step: float = 0.1,
    ) -> None:
        super().__init__(action)
        if not (max_temperature > 0 and temperature_step > 0):
            raise ValueError(
                f"ZeroStdGuard.max_temperature and temperature_step must be > 0, got {max_temperature}, {temperature_step}"
            )
        self.max_temperature, self.temperature_step = max_temperature, temperature_step
        for field, value in (("threshold", threshold), ("pass_fail_threshold", pass_fail_threshold)):
            if value is not None and not 0 < value <= 1:
                raise ValueError(f"ZeroStdGuard.{field} must be in (0, 1], got {value}")
        if window < 1:
            raise ValueError(f"ZeroStdGuard.window must be >= 1, got {window}")
        self.threshold, self.max_reward, self.window = threshold, max_reward, window
        self.pass_fail_threshold = pass_fail_threshold
        self.fractions: deque[float] = deque(maxlen=window)
        self.rewards: deque[float] = deque(maxlen=window)
        self.levels: deque[float] = deque(maxlen=window)
        self.lowest: deque[float] = deque(maxlen=window)
        self.noted = False  # the pass / fail note was logged

    def on_rollout_end(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: RolloutBatch) -> None:
        metrics = pl_module.rollout_metrics
        if "frac_reward_zero_std" not in metrics:
            return
        self.fractions.append(metrics["frac_reward_zero_std"])
        self.lowest.append(metrics.get("frac_groups_all_lowest", float("nan")))
        self.rewards.append(metrics.get("reward_mean", float("nan")))
        self.levels.append(metrics.get("reward_levels", float("inf")))
        reward = sum(self.rewards) / len(self.rewards)
        learned = self.max_reward is not None and reward >= self.max_reward
        message = None
        if len(self.fractions) == self.fractions.maxlen and not learned:
            pass_fail = self._pass_fail(trainer, batch.group_size, reward)
            fractions, threshold = (
                (self.lowest, self.pass_fail_threshold) if pass_fail else (self.fractions, self.threshold)
            )
            frac = sum(fractions) / len(fractions)
            if frac >= threshold:
                message = self._message(trainer, frac, reward, pass_fail)
        if not self.agree(trainer, message is not None):
            self.clear(trainer, pl_module)
            return
        self.fire(trainer, pl_module, message or "rank 0 found too many groups without signal")

    def remedy(self, trainer: L.Trainer, module: L.LightningModule) -> str | None:
        rollout = find_callback(trainer, RolloutCallback, required=False)  # no rollout callback: no remedy
        if rollout is None:
            return None
        for window in (self.fractions, self.rewards, self.levels, self.lowest):
            window.clear()  # judge the remedy on batches sampled with it
        if not rollout.dynamic_sampling:
            rollout.set_dynamic_sampling(True)
            return "dynamic sampling switched on (groups with equal rewards are dropped and refilled)"
        before = rollout.sampling.temperature
        if before < self.max_temperature:
            after = round(min(self.max_temperature, before + self.temperature_step), 6)
            rollout.set_temperature(after)
            return f"sampling temperature raised {before:g} -> {after:g} (max_temperature {self.max_temperature:g})"
        return None

    def _pass_fail(self, trainer: L.Trainer, group_size: int, reward: float) -> bool:
        """Whether the reward is pass / fail over the window; noted once, in one line, the first time
        the zero-std groups reach ``threshold`` (when the plain rule would have fired)."""
        pass_fail = self.pass_fail_threshold is not None and max(self.levels) == 2  # both values seen, never more
        matters = sum(self.fractions) / len(self.fractions) >= self.threshold
        if pass_fail and matters and not self.noted and trainer.global_rank == 0:
            p = min(max(reward, 0.0), 1.0)
            log.info(  # a note, once, for a run that logs at INFO: not an alarm, nothing to print in a healthy run
                f"[{self.name}] note: the reward is pass / fail (two values): all-equal groups of {group_size} are "
                f"expected ({p**group_size + (1 - p) ** group_size:.2f} at the reward mean {p:.3g}); only all-lowest ones alarm"
            )
        self.noted = self.noted or (pass_fail and matters)
        return pass_fail

    def _message(self, trainer: L.Trainer, frac: float, reward: float, pass_fail: bool) -> str:
        rollout = find_callback(trainer, RolloutCallback, required=False)
        refilling = rollout is not None and rollout.dynamic_sampling
        fix = (
            "dynamic sampling is on: raise rollout.selection.max_generation_rounds to refill the batch"
            if refilling
            else "enable dynamic sampling (rollout.selection.dynamic_sampling: true, DAPO)"
        )
        what = "got the lowest reward on every sample (pass / fail reward)" if pass_fail else "have zero reward std"
        return (
            f"{frac:.0%} of groups {what} over the last {len(self.fractions)} batches (reward mean "
            f"{reward:.3g}): {fix}, raise sampling.n or the temperature, or use a denser reward; a reward mean near "
            "its maximum means the prompts have become too easy"
        )


class TruncationGuard(Guard):
    """Most completions hit the length budget (``rollout.sampling.max_new_tokens``) and the cut-off
    ones carry no learning signal: the budget is too small for the task, the answers are cut off and
    nothing is learned.

    A generation batch counts when more than ``threshold`` of its completions ended without EOS
    (``train/truncation_ratio``) *and* those cut-off completions all got the same reward
    (``train/truncated_reward_std`` 0): none of them is better than another, so they teach nothing. It
    fires when ``steps`` batches in a row count, warns once, and starts counting afresh at the first
    batch that does not. A reward that pays cut-off completions (the quickstart's ``prefix_match``: the
    answer is the first character, every completion is cut at 2 tokens) keeps it quiet: truncation
    costs nothing there. With ``max_reward`` set, a batch whose reward mean has reached it does not
    count (all cut off and all right: the task is learned).

    Args:
        threshold: the share of cut-off completions above which a batch counts, in (0, 1].
        steps: consecutive generation batches that must count before it fires.
        max_reward: a batch whose reward mean reached this does not count (None: every batch may).
        action: "warn" logs the alarm, "skip" drops the optimizer step, "stop" ends the run.
    """

    name = "truncation"
    SETTINGS = ("threshold", "steps", "max_reward")

    def __init__(
        self, threshold: float = 0.5, steps: int = 10, max_reward: float | None = None, action: Action = "warn"
    ) -> None:
        super().__init__(action)
        if not 0 < threshold <= 1:
            raise ValueError(f"TruncationGuard.threshold must be in (0, 1], got {threshold}")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"TruncationGuard.steps must be an integer >= 1, got {steps!r}")
        self.threshold, self.steps, self.max_reward = threshold, steps, max_reward
        self.streak = 0  # consecutive batches that counted

    def counts(self, metrics: dict[str, float]) -> bool:
        """Whether one generation batch's statistics count: most completions cut off, all at one reward."""
        share, spread = metrics.get("truncation_ratio", 0.0), metrics.get("truncated_reward_std")
        learned = self.max_reward is not None and metrics.get("reward_mean", -math.inf) >= self.max_reward
        return share > self.threshold and spread is not None and spread <= 1e-6 and not learned

    def on_rollout_end(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: RolloutBatch) -> None:
        metrics = pl_module.rollout_metrics
        if "truncation_ratio" not in metrics:
            return
        self.streak = self.streak + 1 if self.counts(metrics) else 0
        if self.streak < self.steps:
            self.clear(trainer, pl_module)
            return
        self.fire(trainer, pl_module, self._message(trainer, metrics))

    def _message(self, trainer: L.Trainer, metrics: dict[str, float]) -> str:
        rollout = find_callback(trainer, RolloutCallback, required=False)
        budget, option = (None, "rollout.sampling.max_new_tokens") if rollout is None else rollout.completion_budget()
        limit, now = ("the length limit", "") if budget is None else (f"max_new_tokens={budget}", f", now {budget}")
        return (
            f"{metrics['truncation_ratio']:.0%} of completions hit {limit} ({self.streak} generation batches in a row "
            f"above {self.threshold:.0%}) and the cut-off ones all scored {metrics.get('truncated_reward_mean', 0.0):.3g}: "
            f"they carry no learning signal. Give the answers room (raise {option}{now}), or take cut-off "
            "completions out of the signal: rollout.selection.overlong_filter: true (DAPO's overlong filter) or "
            "the soft_overlong reward (DAPO's soft overlong punishment)"
        )

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"streak": self.streak}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.streak = int(state_dict.get("streak", 0))


class MismatchGuard(Guard):
    """The rollout engine's log-probs drift from the trainer's (``train/mismatch_k3``, the k3
    estimate of KL(rollout || trainer) over the step's tokens, and ``train/mismatch_max_abs``).

    Args:
        max_k3: alarm when the step's ``mismatch_k3`` exceeds it (None = not checked).
        max_abs: alarm when the largest per-token gap exceeds it (None = not checked).
        action: ``fix`` switches on the ``correction`` (token-level truncated importance
            sampling, cap 2) in the loss when it has none (`GRPOLoss.set_correction`); then warns.
        correction: the correction ``fix`` switches on.
        correction_args: its arguments.
    """

    name = "mismatch"
    SETTINGS = ("max_k3", "max_abs")

    def __init__(
        self,
        max_k3: float | None = 1e-2,
        max_abs: float | None = None,
        action: Action = "warn",
        correction: str = "tis_token",
        correction_args: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(action)
        CORRECTIONS.get(correction)  # an unknown name fails here, listing the known ones
        self.correction, self.correction_args = correction, dict(correction_args or {})
        self.applied = False  # the fix switched the correction on (re-applied on resume)
        if max_k3 is None and max_abs is None:
            raise ValueError("MismatchGuard needs max_k3 or max_abs")
        self.max_k3, self.max_abs = max_k3, max_abs

    @override
    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        metrics = pl_module.step_metrics.compute()
        found = []
        for key, limit in (("mismatch_k3", self.max_k3), ("mismatch_max_abs", self.max_abs)):
            value = metrics.get(key)
            if limit is not None and value is not None and math.isfinite(value) and value > limit:
                found.append(f"{key} {value:.3g} > {limit:g}")
        if not self.agree(trainer, bool(found)):
            self.clear(trainer, pl_module)
            return
        message = (
            f"rollout and trainer log-probs disagree ({', '.join(found)}): correct for it "
            "(loss.init_args.off_policy.correction: tis_token / mis_token / mis_seq, or off_policy.sequence_mask_delta), "
            "sample in float32 / fp16 rather than bf16, and check that weights reach the engine (rollout.weight_sync.enabled)"
        )
        self.fire(trainer, pl_module, message)

    def remedy(self, trainer: L.Trainer, module: L.LightningModule) -> str | None:
        loss = module.loss_fn if isinstance(module, GRPOModule) else None
        if not isinstance(loss, GRPOLoss) or loss.correction is not None or loss.bypass:
            return None  # a correction is already on: nothing further to switch on
        loss.set_correction(self.correction, self.correction_args)
        self.applied = True
        return f"correction {self.correction} switched on in the loss (GRPOLoss.set_correction)"

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.applied and pl_module.loss_fn.correction is None:  # resumed after a fix
            pl_module.loss_fn.set_correction(self.correction, self.correction_args)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"applied": self.applied}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.applied = bool(state_dict.get("applied", False))
