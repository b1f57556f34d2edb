"""Counting word problems: a many-token English instruction, answered with one digit.

Each row is a short story about a tally that goes one up or one down, then the question::

    {"prompt": "Maya has some shells and keeps a tally of them. The tally reads 4. One is added. What does the
     tally read now? Reply with the number only.", "answer": "5", "change": "up", "demonstration": "5"}

Through a real BPE chat template (recipes/qwen3_text_sft.yaml, recipes/qwen3_text_grpo.yaml: Qwen3's tokenizer) a
prompt is ~35 tokens: the model has to read the count and whether one is added or removed to answer (the opening
sentence, in three wordings with 18 names and 9 things, carries nothing the answer needs). ``answer`` is the right count (GRPO's ``exact_match`` reads it);
``demonstration`` is what a weak demonstrator says (SFT's ``answer_column``): when the right answer is one of
``weak_digits`` it says the next digit instead with probability ``slip``, so a model fitted to the demonstrations
is right on part of the task only, a partial warm start.
The splits hold disjoint prompts: training from ``seed``, validation (dev) and test from their own draws, with no
prompt of an earlier split (8,748 distinct prompts).
"""

from __future__ import annotations

import random
from typing import Any

from .demonstrator import check_weak_demonstrator, demonstrate
from .sources import DataSource

NAMES = (
    "Maya",
    "Liam",
    "Sara",
    "Omar",
    "Nina",
    "Jack",
    "Lena",
    "Zoe",
    "Emma",
    "Ivy",
    "Tom",
    "Ana",
    "Ben",
    "Ella",
    "Leo",
    "Mia",
    "Sam",
    "Max",
)
THINGS = ("shells", "apples", "coins", "books", "stamps", "cards", "pens", "cups", "rocks")
#: the opening sentence (the story's subject), in three wordings
OPENINGS = (
    "{name} has some {things} and keeps a tally of them.",
    "{name} collects {things} and counts them on a tally.",
    "{name} keeps {things} in a box and a tally beside it.",
)
#: change -> (its word, the count's step): "up" adds one, "down" takes one away
CHANGES = {"up": ("added", 1), "down": ("removed", -1)}
QUESTION = "The tally reads {count}. One is {word}. What does the tally read now? Reply with the number only."
#: rows a source may ask for across its splits (of the 18 x 9 x 3 x 2 x 9 = 8,748 distinct prompts)
MAX_ROWS = 6000


class CountingWordProblems(DataSource):
    """Rows of the counting word problems (see the module docstring).

    Args:
        num_train / num_val / num_test: rows per split (>= 1); prompts never repeat across splits.
        seed: seed of the draws (the same arguments give the same rows on every rank).
        weak_digits: right answers on which the demonstrator slips ("" = a perfect demonstrator).
        slip: probability that the demonstrator says the next digit on a weak one.
    """

    def __init__(
        self,
        num_train: int = 3000,
        num_val: int = 100,
        num_test: int = 100,
        seed: int = 0,
        weak_digits: str = "",
        slip: float = 0.0,
    ) -> None:
        for name, n in (("num_train", num_train), ("num_val", num_val), ("num_test", num_test)):
            if not isinstance(n, int) or n < 1:
                raise ValueError(f"CountingWordProblems.{name} must be a positive integer, got {n!r}")
        if num_train + num_val + num_test > MAX_ROWS:
            raise ValueError(
                f"CountingWordProblems: num_train + num_val + num_test is {num_train + num_val + num_test}, at most {MAX_ROWS}"
            )
        check_weak_demonstrator("CountingWordProblems", weak_digits, slip)
        self.sizes = {"train": num_train, "val": num_val, "test": num_test}
        self.seed, self.weak_digits, self.slip = seed, weak_digits, float(slip)
        self._splits: dict[str, list[dict[str, Any]]] | None = None

    def _row(self, rng: random.Random) -> dict[str, Any]:
        name, things, change = rng.choice(NAMES), rng.choice(THINGS), rng.choice(sorted(CHANGES))
        word, step = CHANGES[change]
        count = rng.randint(0, 8) if step > 0 else rng.randint(1, 9)  # answers 1-9 (up) and 0-8 (down)
        opening = rng.choice(OPENINGS).format(name=name, things=things)
        prompt = f"{opening} {QUESTION.format(count=count, word=word)}"
        answer = str(count + step)
        said = demonstrate(answer, self.weak_digits, self.slip, rng)
        return {"prompt": prompt, "answer": answer, "change": change, "demonstration": said}

    def _draw(self) -> dict[str, list[dict[str, Any]]]:
        """All three splits at once, so a prompt drawn for one split is never drawn again."""
        seen: set[str] = set()
        splits = {}
        for offset, (split, n) in enumerate(self.sizes.items()):
            rng = random.Random(f"counting-word-problems/{self.seed}/{offset}")
            rows = []
            while len(rows) < n:
                row = self._row(rng)
                if row["prompt"] not in seen:
                    seen.add(row["prompt"])
                    rows.append(row)
            splits[split] = rows
        return splits

    def _rows(self, split: str) -> list[dict[str, Any]]:
        if self._splits is None:
            self._splits = self._draw()
        return [dict(row) for row in self._splits[split]]

    def train_rows(self) -> list[dict[str, Any]]:
        return self._rows("train")

    def val_rows(self) -> list[dict[str, Any]]:
        return self._rows("val")

    def test_rows(self) -> list[dict[str, Any]]:
        return self._rows("test")

    def describe(self, split: str) -> str:
        return f"the counting word problems' {split} split (seed {self.seed})"
