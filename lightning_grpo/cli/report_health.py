"""What ``lightning-grpo report`` flags: each figure of its summary outside its healthy range, in one line that
says why it matters and which setting to try (the ``look at:`` section that closes ``report.txt``; absent when
every figure is healthy).

The thresholds below are the healthy ranges that docs/guide/your-own-task.md states; a test checks that page
and these constants agree. Several are the default guards' own (docs/guide/stability.md): the report judges
the whole run's figures, the guards each window of steps while it runs. Needs only the standard library.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .run_files import Run, points

LEARNED_REWARD = 0.9
"""Training reward mean (last tenth of the run) from which the task counts as learned: then a collapsed entropy,
groups without spread and identical samples are the learned answer repeated, not a fault. The default guards'
``max_reward``."""

MIN_REWARD_GAIN = 0.05
"""The least rise of the training reward mean from the run's first tenth to its last that counts as learning.
Runs that learned gained +0.6 to +0.9; the tool quickstart's control, which cannot learn, +0.02 to +0.04 in
2000 steps (docs/evidence/learning.md)."""

ENTROPY_FLOOR = 0.05
"""Mean token entropy at the run's last logged step below which the policy has stopped exploring (the default
``EntropyGuard``'s floor); unhealthy while the task is not learned (`LEARNED_REWARD`)."""

MISMATCH_K3_MAX = 0.01
"""Largest ``train/mismatch_k3`` (the k3 estimate of KL(engine || trainer) over a step's tokens) of a healthy
run: the default ``MismatchGuard``'s ``max_k3``. The synchronous quickstart in float32 logs 0; one step of
staleness (``rollout.max_staleness: 1``) 0.001-0.02."""

ZERO_STD_MAX = 0.75
"""Mean fraction of groups whose samples all got one reward (zero advantage: no signal) at or above which a run
that has not learned the task (`LEARNED_REWARD`) gets too little signal: the default ``ZeroStdGuard``'s
``threshold``."""

IDENTICAL_MAX = 0.25
"""Mean fraction of groups with token-identical samples at or above which, before the task is learned, the samples
repeat too often: the default ``IdenticalSamplesGuard``'s ``threshold``."""

TRUNCATION_MAX = 0.5
"""Mean fraction of completions cut off by ``max_new_tokens`` above which, when the cut-off ones all got one
reward and the task is not learned, the length budget hides the answer: the default ``TruncationGuard``'s
``threshold``."""

SPREAD_ZERO = 1e-6
"""A reward standard deviation at or below this counts as zero (the cut-off completions' rewards do not differ)."""

PAGE = "docs/guide/your-own-task.md"
"""Where each line of the section is explained, with its healthy range and what to change."""


def _mean(values: list[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def _tenths(values: list[float]) -> tuple[float, float]:
    n = max(1, len(values) // 10)
    return math.fsum(values[:n]) / n, math.fsum(values[-n:]) / n


class _Figures:
    """The run's figures the checks read: the training reward's tenths and whether the task is learned."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.reward = run.values("train/reward_mean")
        self.first, self.last = _tenths(self.reward) if self.reward else (math.nan, math.nan)
        self.learned = bool(self.reward) and self.last >= LEARNED_REWARD
        highest = run.values("train/reward_max") or self.reward
        self.never_paid = bool(highest) and max(abs(v) for v in highest) == 0


def _reward_zero(f: _Figures) -> str | None:
    if not f.never_paid:
        return None
    return (
        "reward: 0 at every logged step, nothing is learned: check the answer's type (answers reach rewards as "
        "text), the reward's name and the column it reads, the format it extracts (completions.jsonl shows what "
        "the model writes) and truncation (rollout.sampling.max_new_tokens)"
    )


def _reward_gain(f: _Figures) -> str | None:
    gain = f.last - f.first
    if f.never_paid or len(f.reward) < 2 or f.learned or gain >= MIN_REWARD_GAIN:
        return None
    figure = f"reward: first tenth {f.first:.3f} -> last tenth {f.last:.3f} ({gain:+.3f}, under +{MIN_REWARD_GAIN:g})"
    if gain < 0:
        return (
            f"{figure}: it fell; a learning rate too high for the model (model.optimizer.init_args.lr: a pretrained "
            "model takes 1e-6 to 1e-5, LoRA about 10x that), or the reward pays something the policy unlearns"
        )
    return (
        f"{figure}: not learning; train longer (trainer.max_steps), try another learning rate "
        "(model.optimizer.init_args.lr), easier prompts or a reward with partial credit"
    )


def _held_out(f: _Figures) -> str | None:
    accuracy = points(f.run, "val/greedy_accuracy")
    if len(accuracy) < 2 or not f.reward or f.last - f.first < MIN_REWARD_GAIN:
        return None
    (_, before), (_, after) = accuracy[0], accuracy[-1]
    if after > before or after >= LEARNED_REWARD:
        return None
    return (
        f"held-out greedy accuracy: {before:.3f} -> {after:.3f} while the training reward rose "
        f"{f.last - f.first:+.3f}: the policy learns the training prompts or the reward, not the task; more "
        "training prompts, a reward that only the right answer satisfies"
    )


def _entropy(f: _Figures) -> str | None:
    entropy = f.run.values("train/entropy")
    if not entropy or entropy[-1] >= ENTROPY_FLOOR or f.learned or not f.reward:
        return None
    return (
        f"entropy: {entropy[-1]:.3f} at the end (under {ENTROPY_FLOOR:g}) with the reward at {f.last:.3f}: the "
        "policy stopped exploring before it learned the task; an entropy bonus "
        "(model.loss.init_args.terms.entropy_coef) or an EntropyController, or a lower learning rate"
    )


def _mismatch(f: _Figures) -> str | None:
    k3 = f.run.values("train/mismatch_k3")
    if not k3 or max(k3) <= MISMATCH_K3_MAX:
        return None
    return (
        f"mismatch: max k3 {max(k3):.3g} (over {MISMATCH_K3_MAX:g}): the engine samples from other weights or "
        "other arithmetic than the trainer's; expected with rollout.max_staleness >= 1, else sample in float32 "
        "(rollout.vllm.dtype) or add a correction (model.loss.init_args.off_policy.correction: tis_token)"
    )


def _skipped(f: _Figures) -> str | None:
    skipped = f.run.values("train/skipped_steps")
    if not skipped or skipped[-1] <= 0:
        return None
    return (
        f"skipped optimizer steps: {skipped[-1]:.0f} (a non-finite loss or gradient): lower the learning rate, "
        "clip gradients (trainer.gradient_clip_val), train in float32; the alarms name the steps"
    )


def _zero_std(f: _Figures) -> str | None:
    share = _mean(f.run.values("train/frac_reward_zero_std"))
    if share is None or share < ZERO_STD_MAX or f.learned or f.never_paid:
        return None
    return (
        f"zero-reward-std groups: mean fraction {share:.3f} (at least {ZERO_STD_MAX:g}) before the task is learned: "
        "most groups teach nothing; more samples per prompt (rollout.sampling.n), easier prompts, a reward with "
        "partial credit, or rollout.selection.dynamic_sampling: true"
    )


def _identical(f: _Figures) -> str | None:
    share = _mean(f.run.values("train/frac_identical_groups"))
    if share is None or share < IDENTICAL_MAX or f.learned or f.never_paid:
        return None
    return (
        f"identical-sample groups: mean fraction {share:.3f} (at least {IDENTICAL_MAX:g}) before the task is "
        "learned: a group's samples repeat, so they cannot differ in reward; raise rollout.sampling.temperature "
        "or add an entropy bonus; at temperature > 0 with a high entropy, the samples share one seed"
    )


def _truncation(f: _Figures) -> str | None:
    share = _mean(f.run.values("train/truncation_ratio"))
    spread = _mean(f.run.values("train/truncated_reward_std"))
    if share is None or spread is None or share <= TRUNCATION_MAX or spread > SPREAD_ZERO or f.learned:
        return None
    return (
        f"cut-off completions: mean fraction {share:.3f} (over {TRUNCATION_MAX:g}), all at one reward: the "
        "answer does not fit; raise rollout.sampling.max_new_tokens, or ask for a shorter answer"
    )


#: The checks, in the order of the summary's lines; each returns its line or None.
CHECKS: tuple[Callable[[_Figures], str | None], ...] = (
    _reward_zero,
    _reward_gain,
    _held_out,
    _entropy,
    _mismatch,
    _skipped,
    _zero_std,
    _identical,
    _truncation,
)


def look_at(run: Run) -> list[str]:
    """One line per figure of ``run`` outside its healthy range (none when all are healthy)."""
    figures = _Figures(run)
    return [line for check in CHECKS if (line := check(figures)) is not None]


def look_at_lines(run: Run) -> list[str]:
    """The ``look at:`` section of the summary: a heading and the lines of `look_at`, or nothing."""
    lines = look_at(run)
    if not lines:
        return []
    return [f"look at ({PAGE} says what each means):", *(f"  {line}" for line in lines)]
