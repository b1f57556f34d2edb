"""Guards: a detector and an action for each known way GRPO runs die.

Each guard is a Lightning callback with an ``action``:

- ``warn``: log a warning naming the symptom and the knob that fixes it;
- ``skip``: also drop the current optimizer step (its gradients are discarded, every rank
  skips; counted in ``train/skipped_steps``);
- ``stop``: also skip the step and stop the run (``trainer.should_stop``), with the diagnosis in
  the log and in `Guard.stop_message`;
- ``fix``: apply the guard's known remedy (`Guard.remedy`) through the object that owns
  the setting, log what changed; when no remedy is left, warn. Only guards with a remedy
  accept it: ZeroStdGuard (dynamic sampling, then a higher temperature), MismatchGuard (the
  TIS correction). Under DDP rank 0 decides for every rank.

Whatever the action, a firing guard logs ``alarm/<name> = 1`` at that step (0 at checks where
it does not fire; the markers of ``lightning-grpo report``) and appends ``{"step", "guard", "action", "message"}`` to
``alarms.jsonl`` in the logger's directory. Warnings are edge-triggered: one when a condition
starts to hold, not one per step while it lasts, and at most one per 100 steps for a condition
that comes and goes.

Two moments are watched: ``on_rollout_end`` (a fresh rollout batch, before it trains:
non-finite log-probs, identical samples, zero reward std, cut-off completions) and ``on_before_optimizer_step``
(the step's gradients and loss metrics over all micro-batches and ranks: non-finite loss or
gradient norm, entropy, train-inference mismatch).

| guard | what it checks | default |
|---|---|---|
| `NonFiniteGuard` | the step's loss and gradient norm are finite | skip; stop after 3 in a row |
| `LogProbGuard` | the rollout / old / reference log-probs are finite on valid completion tokens | stop |
| `EntropyGuard` | the token entropy stays between a floor and a ceiling and does not collapse or rise by a factor within a window | warn |
| `IdenticalSamplesGuard` | no group's samples are token-identical at temperature > 0 | warn |
| `MismatchGuard` | the k3 gap between the engine's and the trainer's log-probs stays under a bound | warn |
| `ZeroRewardGuard` | some reward is non-zero within the run's first 10 generation batches (callbacks/zero_reward.py) | warn, once |
| `ZeroStdGuard` | most groups' rewards have a spread (no spread: no signal) | warn |
| `TruncationGuard` | most completions are not cut off by `max_new_tokens` at one reward | warn |
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections import deque
from typing import Any, ClassVar, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from ..core.batch import RolloutBatch
from ..training.metrics import hands_step_metrics_over
from .distributed import local_log_dir
from .lookup import find_callback
from .rollout import RolloutCallback

Action = Literal["warn", "skip", "stop", "fix"]
ACTIONS = ("warn", "skip", "stop", "fix")
log = logging.getLogger("lightning_grpo.guards")


class Guard(Callback):
    """Base class: `fire` records an alarm and carries out the configured action."""

    name: ClassVar[str] = "guard"
    #: The constructor settings that tell two guards of one type apart (their ``state_key``).
    SETTINGS: ClassVar[tuple[str, ...]] = ()
    #: A "warn" guard that stops and starts firing again stays silent (alarms are still recorded)
    #: for this many steps after its last warning.
    REWARN_AFTER: ClassVar[int] = 100
    #: The guard checks in ``on_validation_end`` (its alarm column goes straight to the loggers).
    CHECKS_AT_VALIDATION: ClassVar[bool] = False

    def __init__(self, action: Action) -> None:
        actions = ACTIONS if type(self).remedy is not Guard.remedy else ACTIONS[:3]
        if action not in actions:
            raise ValueError(f"{type(self).__name__}.action must be one of {', '.join(actions)}; got {action!r}")
        self.action = action
        self.alarms: list[dict[str, Any]] = []
        self.stop_message: str | None = None
        self._firing = False  # for edge-triggered warnings
        self._warned_at: int | None = None

    def fire(self, trainer: L.Trainer, module: L.LightningModule, message: str, action: Action | None = None) -> None:
        """Record the alarm and act on it (``action`` overrides the configured one)."""
        action = action or self.action
        step = trainer.global_step
        if action == "fix":
            change = self.remedy(trainer, module)
            if change is None:
                action, message = "warn", f"{message} (no automatic remedy left)"
            else:
                message = f"{message} -> fixed: {change}"
                self._firing, self._warned_at = False, None  # every fix is logged
        record = {"step": step, "guard": self.name, "action": action, "message": message}
        completions = _log_completions(trainer, module)
        if completions is not None:  # where the completions of this step are (lightning-grpo report shows it)
            record["completions"] = completions
        self.alarms.append(record)
        self._log_alarm(trainer, module, 1.0)
        _append_alarm(trainer, record)
        text = f"[{self.name}] step {step}: {message}"
        if action in ("skip", "stop"):
            module.skip_optimizer_step(text)
        if action == "stop":
            trainer.should_stop = True
            self.stop_message = text
            text += " -> stopping the run"
        elif action == "skip":
            text += " -> optimizer step skipped"
        quiet = self._warned_at is not None and step - self._warned_at < self.REWARN_AFTER
        if trainer.global_rank == 0 and (action != "warn" or not (self._firing or quiet)):
            log.warning(text)
            self._warned_at = step
        self._firing = True

    def _log_alarm(self, trainer: L.Trainer, module: L.LightningModule, value: float) -> None:
        if self.CHECKS_AT_VALIDATION:  # Lightning refuses self.log in on_validation_end: write to the loggers
            for logger in trainer.loggers if trainer.global_rank == 0 else ():
                logger.log_metrics({f"alarm/{self.name}": value}, step=trainer.global_step)
        elif value or hands_step_metrics_over(trainer):  # a firing always; a quiet check where written
            module.log(f"alarm/{self.name}", value, on_step=True, on_epoch=False, batch_size=1)

    def remedy(self, trainer: L.Trainer, module: L.LightningModule) -> str | None:
        """Apply the next known remedy and describe the change; None when none is left (action
        ``fix``). Guards without a remedy do not override this and refuse ``action="fix"``."""
        return None

    def agree(self, trainer: L.Trainer, fires: bool) -> bool:
        """With ``fix`` under DDP, rank 0's verdict for every rank (a remedy changes settings that
        all ranks must share); otherwise this rank's. Call on every rank at the same point."""
        if self.action == "fix" and trainer.world_size > 1:
            return bool(trainer.strategy.broadcast(bool(fires), src=0))
        return fires

    def clear(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        """The condition does not hold at this check: log ``alarm/<name> = 0``; the next firing warns again."""
        self._log_alarm(trainer, module, 0.0)
        self._firing = False

    @property
    @override
    def state_key(self) -> str:
        """Unique per configuration, so several guards of one type can share a Trainer (and a checkpoint)."""
        return self._generate_state_key(action=self.action, **{name: getattr(self, name) for name in self.SETTINGS})


def _log_completions(trainer: L.Trainer, module: L.LightningModule) -> str | None:
    """Have the rollout callback (if any) log the current batch's completions; where they are written."""
    rollout = find_callback(trainer, RolloutCallback, required=False)
    return None if rollout is None else rollout.completion_log.log_for_alarm(trainer, module)


def _append_alarm(trainer: L.Trainer, record: dict[str, Any]) -> None:
    """Append one alarm to ``<log_dir>/alarms.jsonl`` (rank 0, only when a logger is configured)."""
    # not trainer.log_dir: a broadcast, and a guard may fire on rank 0 alone
    log_dir = local_log_dir(trainer) if trainer.global_rank == 0 and trainer.loggers else None
    if log_dir is None:
        return
    os.makedirs(log_dir, exist_ok=True)
    with open(os.path.join(log_dir, "alarms.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


class NonFiniteGuard(Guard):
    """NaN / inf in the loss or the gradient norm: drop the step (default), stop after
    ``max_consecutive`` such steps in a row.

    Args:
        action: "skip" (default), "stop", or "warn" (the optimizer then applies the bad gradients).
        max_consecutive: stop once this many optimizer steps in a row were non-finite.
    """

    name = "non_finite"
    SETTINGS = ("max_consecutive",)

    def __init__(self, action: Action = "skip", max_consecutive: int = 3) -> None:
        super().__init__(action)
        if max_consecutive < 1:
            raise ValueError(f"NonFiniteGuard.max_consecutive must be >= 1, got {max_consecutive}")
        self.max_consecutive = max_consecutive
        self.consecutive = 0
        self.total = 0

    @override
    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        norm = float(pl_module.grad_norm())
        loss = pl_module.step_metrics.compute().get("loss", 0.0)
        checked = (("loss", loss), ("gradient norm", norm))
        bad = [f"{what} is {value}" for what, value in checked if not math.isfinite(value)]
        if not bad:
            self.consecutive = 0
            self.clear(trainer, pl_module)
            return
        self.consecutive += 1
        self.total += 1
        message = " and ".join(bad)
        if self.consecutive >= self.max_consecutive and self.action != "warn":
            causes = (
                "learning rate too high, fp16 overflow (train in bf16 / fp32), NaN log-probs "
                "(LogProbGuard), a reward returning NaN"
            )
            message += f" for {self.consecutive} optimizer steps in a row (max_consecutive={self.max_consecutive}); look for: {causes}"
            self.fire(trainer, pl_module, message, action="stop")
        else:
            self.fire(trainer, pl_module, message)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"consecutive": self.consecutive, "total": self.total}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.consecutive, self.total = int(state_dict["consecutive"]), int(state_dict["total"])


class LogProbGuard(Guard):
    """Non-finite rollout / old / reference log-probs on valid completion tokens (a known
    failure: ``old_log_prob`` turned NaN and the model went on to emit "!!!!!!").

    The affected rows are always taken out of the loss (their completion mask is zeroed and their
    values replaced by 0), so the step never trains on NaN; then the action applies: "stop"
    (default) ends the run naming tensor, rows and step; "skip" drops this optimizer step; "warn"
    trains on the remaining rows.

    Args:
        action: "warn" logs the alarm, "skip" drops the optimizer step, "stop" ends the run. Default "stop".
    """

    name = "non_finite_logprobs"
    TENSORS = ("rollout_logp", "old_logp", "ref_logp")

    def __init__(self, action: Action = "stop") -> None:
        super().__init__(action)

    def on_rollout_end(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: RolloutBatch) -> None:
        valid = batch.completion_mask > 0  # [B, T]
        findings, bad_rows = [], torch.zeros(len(valid), dtype=torch.bool, device=valid.device)
        for name in self.TENSORS:
            tensor = getattr(batch, name)
            if tensor is None:
                continue
            rows = (~torch.isfinite(tensor) & valid).any(-1)  # [B]
            if rows.any():
                findings.append(
                    f"{name} is non-finite on valid tokens of rows {rows.nonzero().flatten().tolist()[:16]}"
                )
                bad_rows |= rows
                tensor.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
        if not findings:
            self.clear(trainer, pl_module)
            return
        batch.completion_mask[bad_rows] = 0
        causes = (
            "non-finite weights (NonFiniteGuard), fp16 overflow in the engine or the trainer (use bf16 / fp32), "
            "-inf log-probs from top-k / top-p truncation"
        )
        message = f"{'; '.join(findings)} (of {len(valid)} rows); likely causes: {causes}"
        self.fire(trainer, pl_module, message)


class EntropyGuard(Guard):
    """Entropy collapse (below ``floor``, or falling by ``collapse_factor`` within ``window``
    steps) and explosion (above ``ceiling``, or rising by ``rise_factor`` within ``window``).

    The entropy is the mean over the step's valid completion tokens (``train/entropy``). Set
    ``max_reward`` to ignore a collapse when the rollout reward mean has reached it within the
    window: on a task with one right answer a policy that has learned it is rightly confident.

    Args:
        floor: fire when the entropy falls below this (None: no floor).
        ceiling: fire when the entropy rises above this (None: no ceiling).
        collapse_factor: fire when the entropy falls by this factor within `window` steps.
        rise_factor: fire when the entropy rises by this factor within `window` steps.
        window: steps compared by the two factors.
        max_reward: ignore a collapse once the reward mean reached this within the window.
        action: "warn" logs the alarm, "skip" drops the optimizer step, "stop" ends the run.

    Example:
        ```python
        import lightning as L
        from lightning_grpo import EntropyGuard, ZeroStdGuard

        # naming a guard replaces the default set: list every guard you want
        trainer = L.Trainer(callbacks=[EntropyGuard(floor=0.05, max_reward=0.9), ZeroStdGuard(action="fix")])
        ```
    """

    name = "entropy"
    SETTINGS = ("floor", "ceiling", "collapse_factor", "rise_factor", "window", "max_reward")
    COLLAPSE_KNOBS = (
        "raise the upper clip (loss.init_args.policy_loss_args.eps_high, DAPO Clip-Higher: 0.28), use "
        "policy_loss clip_cov or kl_cov, advantage qae, or loss.init_args.terms.entropy_coef > 0; lower the lr"
    )
    EXPLOSION_KNOBS = (
        "lower the lr, tighten eps_high, add a KL term (loss.init_args.kl.beta), use clip_cov / kl_cov, "
        "and check the train-inference mismatch (MismatchGuard)"
    )

    def __init__(
        self,
        floor: float | None = None,
        ceiling: float | None = None,
        collapse_factor: float | None = None,
        rise_factor: float | None = None,
        window: int = 50,
        max_reward: float | None = None,
        action: Action = "warn",
    ) -> None:
        super().__init__(action)
        if floor is None and ceiling is None and collapse_factor is None and rise_factor is None:
            raise ValueError("EntropyGuard needs at least one of floor, ceiling, collapse_factor, rise_factor")
        for field, value in (("collapse_factor", collapse_factor), ("rise_factor", rise_factor)):
            if value is not None and value <= 1:
                raise ValueError(f"EntropyGuard.{field} must be > 1, got {value}")
        if window < 1:
            raise ValueError(f"EntropyGuard.window must be >= 1, got {window}")
        self.floor, self.ceiling, self.window, self.max_reward = floor, ceiling, window, max_reward
        self.collapse_factor, self.rise_factor = collapse_factor, rise_factor
        self.history: deque[float] = deque(maxlen=window + 1)
        self.rewards: deque[float] = deque(maxlen=window + 1)

    @override
    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        entropy = pl_module.step_metrics.compute().get("entropy")
        if entropy is None or not math.isfinite(entropy):
            return
        self.history.append(entropy)
        reward = pl_module.rollout_metrics.get("reward_mean")
        if reward is not None and math.isfinite(reward):
            self.rewards.append(reward)
        message = self._collapse(entropy) or self._explosion(entropy)
        if message is None:
            self.clear(trainer, pl_module)
        else:
            self.fire(trainer, pl_module, message)

    def _collapse(self, entropy: float) -> str | None:
        if self.max_reward is not None and self.rewards and max(self.rewards) >= self.max_reward:
            return None  # the task has been learned within the window: confidence is expected
        first = self.history[0]
        if self.floor is not None and entropy < self.floor:
            what = f"entropy collapse: {entropy:.3g} below floor {self.floor:g}"
        elif self.collapse_factor and len(self.history) > self.window and entropy * self.collapse_factor <= first:
            what = f"entropy collapse: fell {first / max(entropy, 1e-12):.1f}x in {self.window} steps ({first:.3g} -> {entropy:.3g})"
        else:
            return None
        return f"{what}; {self.COLLAPSE_KNOBS}"

    def _explosion(self, entropy: float) -> str | None:
        first = self.history[0]
        if self.ceiling is not None and entropy > self.ceiling:
            what = f"entropy explosion: {entropy:.3g} above ceiling {self.ceiling:g}"
        elif self.rise_factor and len(self.history) > self.window and entropy >= self.rise_factor * first:
            what = f"entropy explosion: rose {entropy / max(first, 1e-12):.1f}x in {self.window} steps ({first:.3g} -> {entropy:.3g})"
        else:
            return None
        return f"{what}; {self.EXPLOSION_KNOBS}"
