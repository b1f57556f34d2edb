"""The built-in synthetic verifiable task: four digits, then ``=``, then the answer.

A prompt is four random digits followed by ``=`` (plain text, no chat template), e.g. ``"4821="``;
the answer is one digit computed from the prompt by a named rule (default ``(last + 1) mod 10``,
so ``"4821="`` -> ``"2"``). A tiny random model learns it in about 1000 GRPO steps on a CPU
(see ``docs`` / the quickstart), which makes it the smoke test of the whole pipeline.

The splits are generated deterministically from a seed, the validation and test prompts never occur
in the training set or in each other, and every answer is equally frequent in both splits (to within one prompt), so
guessing a digit scores 0.1 on average. The rule ``count_to_last`` has multi-character answers of
one to ten characters (``"4823="`` -> ``"0123"``), for claims about completion length.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from lightning_grpo.core.registry import Registry
from lightning_grpo.data.sources import DataSource, Split

#: A rule maps the four prompt digits (a string like ``"4821"``) to the answer (a string of
#: digits; every rule has ten distinct answers).
DigitRule = Callable[[str], str]

DIGIT_RULES: Registry = Registry("digit task rule")

#: Number of digits before the ``=``.
NUM_DIGITS = 4


@DIGIT_RULES.register("last_plus_one")
def last_plus_one(digits: str) -> str:
    """``(last digit + 1) mod 10``: ``"4821"`` -> ``"2"``."""
    return str((int(digits[-1]) + 1) % 10)


@DIGIT_RULES.register("last_digit")
def last_digit(digits: str) -> str:
    """The last digit: ``"4821"`` -> ``"1"``."""
    return digits[-1]


@DIGIT_RULES.register("first_digit")
def first_digit(digits: str) -> str:
    """The first digit: ``"4821"`` -> ``"4"``."""
    return digits[0]


@DIGIT_RULES.register("count_to_last")
def count_to_last(digits: str) -> str:
    """The digits from 0 up to the last digit, 1 to 10 characters: ``"4823"`` -> ``"0123"``."""
    return "".join(str(d) for d in range(int(digits[-1]) + 1))


def _quotas(total: int, answers: list[str], rng: random.Random) -> dict[str, int]:
    """Split ``total`` prompts over the (sorted) distinct ``answers`` as evenly as possible.

    The ``total % len(answers)`` answers that get one extra prompt are picked at random.
    """
    k = len(answers)
    extra = set(rng.sample(range(k), total % k))
    return {a: total // k + (1 if i in extra else 0) for i, a in enumerate(answers)}


def digit_task(
    seed: int = 0,
    num_train: int = 300,
    num_val: int = 50,
    rule: str = "last_plus_one",
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Training and validation records ``{"prompt": "4821=", "answer": "2"}`` for the digit task.

    Args:
        seed: Seed of the draw; the same arguments always give the same two lists.
        num_train: Number of training prompts (>= 1).
        num_val: Number of validation prompts (>= 0); disjoint from the training prompts.
        rule: Name of the answer rule in `DIGIT_RULES` (``"last_plus_one"``,
            ``"last_digit"``, ``"first_digit"``, ``"count_to_last"``).

    Returns:
        ``(train, val)``: each a shuffled list of records whose answers are balanced over the
        rule's ten answers (each appears ``n // 10`` or ``n // 10 + 1`` times).
    """
    train, val, _ = digit_splits(seed, num_train, num_val, 0, rule)
    return train, val


def digit_splits(
    seed: int = 0,
    num_train: int = 300,
    num_val: int = 50,
    num_test: int = 0,
    rule: str = "last_plus_one",
) -> tuple[list[dict[str, str]], list[dict[str, str]], list[dict[str, str]]]:
    """``(train, val, test)`` of the digit task: train and val exactly as `digit_task` draws them,
    and ``num_test`` test records (balanced the same way) from the prompts neither of them holds, with
    their own random stream (so adding a test split changes no training or validation prompt)."""
    rule_fn: DigitRule = DIGIT_RULES.get(rule)
    for name, value, low in (("num_train", num_train, 1), ("num_val", num_val, 0), ("num_test", num_test, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"digit_task: {name} must be an integer >= {low}, got {value!r}")
    rng = random.Random(seed)
    # Every possible prompt, grouped by its answer, each group in a seeded random order.
    by_answer: dict[str, list[str]] = {}
    for n in range(10**NUM_DIGITS):
        digits = f"{n:0{NUM_DIGITS}d}"
        by_answer.setdefault(rule_fn(digits), []).append(digits)
    by_answer = {a: by_answer[a] for a in sorted(by_answer)}  # "0" .. "9" for one-digit rules
    for group in by_answer.values():
        rng.shuffle(group)
    answers = list(by_answer)
    val_quota, train_quota = _quotas(num_val, answers, rng), _quotas(num_train, answers, rng)
    test_rng = random.Random(f"digit-task-test/{seed}")  # its own stream: train and val stay as they were
    test_quota = _quotas(num_test, answers, test_rng)
    splits: tuple[list[dict[str, str]], ...] = ([], [], [])  # train, val, test
    for answer, group in by_answer.items():
        ends = [val_quota[answer], val_quota[answer] + train_quota[answer]]
        ends.append(ends[1] + test_quota[answer])  # group = [val | train | test | unused]
        if ends[2] > len(group):
            raise ValueError(
                f"digit_task: rule {rule!r} has only {len(group)} distinct prompts with answer "
                f"{answer}, but num_train={num_train}, num_val={num_val} and num_test={num_test} need {ends[2]}"
            )
        for split, (start, end) in zip((1, 0, 2), ((0, ends[0]), (ends[0], ends[1]), (ends[1], ends[2]))):
            splits[split].extend({"prompt": d + "=", "answer": answer} for d in group[start:end])
    train, val, test = splits
    rng.shuffle(train)
    rng.shuffle(val)
    test_rng.shuffle(test)
    return train, val, test


class DigitTask(DataSource):
    """The built-in digit task (`digit_splits`): four-digit prompts
    (``"4821="``) whose answer follows ``rule``, generated from ``seed``; the test prompts are none of
    the training or validation prompts.

    Args:
        seed: Seed of the task's prompts (not of the training run).
        rule: Answer rule (``"last_plus_one"``, ``"last_digit"``, ``"first_digit"``, or
            ``"count_to_last"`` with answers of 1-10 characters).
        num_train: Training prompts.
        num_val: Validation (dev) prompts.
        num_test: Test prompts (none of them a training or validation prompt; adding them changes
            neither of those splits); 0 for none.
    """

    def __init__(
        self, seed: int = 0, rule: str = "last_plus_one", num_train: int = 300, num_val: int = 50, num_test: int = 50
    ) -> None:
        if rule not in DIGIT_RULES:
            raise ValueError(f"data.source.rule must be one of {', '.join(DIGIT_RULES.names())}, got {rule!r}")
        for name, value, low in (("num_train", num_train, 1), ("num_val", num_val, 0), ("num_test", num_test, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"data.source.{name} must be an integer >= {low}, got {value!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"data.source.seed must be an integer, got {seed!r}")
        self.seed, self.rule, self.num_train, self.num_val, self.num_test = seed, rule, num_train, num_val, num_test

    def _split(self, index: int) -> list[dict[str, Any]]:
        splits = digit_splits(
            seed=self.seed, rule=self.rule, num_train=self.num_train, num_val=self.num_val, num_test=self.num_test
        )
        return splits[index]

    def train_rows(self) -> list[dict[str, Any]]:
        return self._split(0)

    def val_rows(self) -> list[dict[str, Any]] | None:
        return self._split(1)

    def test_rows(self) -> list[dict[str, Any]] | None:
        return self._split(2) if self.num_test else None

    def describe(self, split: Split) -> str:
        return {
            "train": "the digit task's training split",
            "val": "the digit task's validation split",
            "test": "the digit task's test split",
        }[split]
