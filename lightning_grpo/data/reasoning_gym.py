"""reasoning-gym tasks as training data, with their own verifiers as a reward (extra ``reasoning-gym``).

`reasoning-gym <https://github.com/open-thought/reasoning-gym>`_ generates reasoning tasks
procedurally (arithmetic, spelling, logic, puzzles; ``reasoning_gym.factory.DATASETS``) and scores
an answer with each task's ``score_answer(answer, entry)`` in [0, 1] (partial credit where the task
gives it). Here:

* :class:`ReasoningGymSource` (a :class:`~lightning_grpo.data.sources.DataSource`): a weighted mix
  of tasks, each with its config or curriculum level; ``size`` training rows drawn with ``seed``,
  ``val_size`` held-out (dev) rows drawn with ``val_seed`` (another seed) and never in the training rows;
  ``test_size`` test rows drawn with ``test_seed``, never in the training or dev rows (docs/evidence/tuning.md);
  optionally reasoning-gym's answer-format system prompt;
* the reward ``reasoning_gym``: extracts the answer from a completion (the stripped text, or the
  last ``<answer>...</answer>``) and returns the row's task's ``score_answer`` on it;
* curricula: :meth:`ReasoningGymSource.set_level` moves a task to another level of its
  reasoning-gym curriculum; :class:`~lightning_grpo.callbacks.curriculum.CurriculumCallback` does so
  when the task's accuracy passes a threshold.

A row holds ``prompt`` (the question, or chat messages with the system prompt), ``question``,
``answer``, ``task`` (the reasoning-gym name), ``metadata`` (the entry's, for ``score_answer``),
``task_config`` (the config the entry was drawn with) and ``level`` (its curriculum level, -1 for
none). ``reasoning_gym`` is imported on first use, never by ``import lightning_grpo``.
"""

from __future__ import annotations

import difflib
import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

from lightning_grpo.data.registry import REWARDS, validated_by
from lightning_grpo.data.sources import DataSource, Split

#: How the reward reads the answer from a completion: ``"plain"`` (the completion, stripped) or
#: ``"answer_tags"`` (the last ``<answer>...</answer>``, the format of reasoning-gym's system prompt).
ANSWER_FORMATS = ("plain", "answer_tags")
#: How many times the held-out quota is drawn before giving up on finding questions outside the training rows.
_VAL_DRAWS = 20


def import_reasoning_gym():
    """The ``reasoning_gym`` module, or an ImportError naming the extra that installs it."""
    try:
        import reasoning_gym
        import reasoning_gym.factory  # DATASETS, create_curriculum
    except ImportError as err:
        raise ImportError(
            "reasoning-gym tasks need the reasoning-gym package: pip install 'lightning-grpo[reasoning-gym]'"
        ) from err
    return reasoning_gym


@dataclass
class ReasoningGymTask:
    """One task of a :class:`ReasoningGymSource` mix, as written in a recipe."""

    name: str
    """reasoning-gym dataset name (``reasoning_gym.factory.DATASETS``), e.g. ``"spell_backward"``."""
    weight: float = 1.0
    """Share of the rows (weights are normalised over the tasks)."""
    config: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the task's config class (e.g. ``{min_word_len: 3, max_word_len: 3}``)."""
    level: int | None = None
    """Curriculum level (0 = easiest): the curriculum sets its attributes (over ``config``'s); ``None``
    uses ``config`` as given and no curriculum (the curriculum callback leaves the task alone)."""


def _check_task(task: ReasoningGymTask, index: int) -> None:
    """One clear error for a bad task: unknown name (with close names), bad weight, config or level."""
    factory = import_reasoning_gym().factory
    where = f"data.source.tasks[{index}]"
    if task.name not in factory.DATASETS:
        close = difflib.get_close_matches(str(task.name), factory.DATASETS, n=5, cutoff=0.5)
        hint = f"; close names: {close}" if close else ""
        raise ValueError(
            f"{where}.name: unknown reasoning-gym task {task.name!r}{hint} "
            f"(all {len(factory.DATASETS)} names: reasoning_gym.factory.DATASETS)"
        )
    if (
        isinstance(task.weight, bool)
        or not isinstance(task.weight, (int, float))
        or not (math.isfinite(task.weight) and task.weight > 0)
    ):
        raise ValueError(f"{where}.weight ({task.name}): must be a finite number > 0, got {task.weight!r}")
    if not isinstance(task.config, dict):
        raise ValueError(f"{where}.config ({task.name}): must be a mapping of config fields, got {task.config!r}")
    reserved = sorted({"seed", "size"} & set(task.config))
    if reserved:
        raise ValueError(
            f"{where}.config ({task.name}): {reserved} are set by the source (seed, size, val_seed, val_size)"
        )
    if task.level is not None:
        if not factory.has_curriculum(task.name):
            raise ValueError(f"{where}.level ({task.name}): this task has no reasoning-gym curriculum; set level: null")
        top = _max_level(task.name)
        if isinstance(task.level, bool) or not isinstance(task.level, int) or not 0 <= task.level <= top:
            raise ValueError(f"{where}.level ({task.name}): must be an integer in [0, {top}], got {task.level!r}")
    try:
        config = _config_at(task)
        factory.DATASETS[task.name][1](**config).validate()
    except (TypeError, AssertionError, ValueError) as err:
        raise ValueError(f"{where}.config ({task.name}): {type(err).__name__}: {err}") from err


def _max_level(name: str) -> int:
    curriculum = import_reasoning_gym().factory.create_curriculum(name)
    return max(len(attr.levels) - 1 for attr in curriculum.attributes.values())


def _config_at(task: ReasoningGymTask) -> dict[str, Any]:
    """``task.config`` with the curriculum's attributes at ``task.level`` (as given when level is None)."""
    if task.level is None:
        return dict(task.config)
    curriculum = import_reasoning_gym().factory.create_curriculum(task.name)
    curriculum.set_global_level(task.level)
    config = curriculum.generate_configuration(defaults=dict(task.config))
    return {k: v for k, v in vars(config).items() if k not in ("seed", "size")}


def _quotas(total: int, weights: list[float]) -> list[int]:
    """``total`` split in proportion to ``weights`` (largest remainders, ties to the earlier task)."""
    exact = [total * w / sum(weights) for w in weights]
    counts = [math.floor(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (counts[i] - exact[i], i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def _derive_seed(seed: int, *parts: Any) -> int:
    """A 31-bit seed for one (split, task, level) draw, stable across runs and platforms."""
    return random.Random("/".join(map(str, (seed, *parts)))).getrandbits(31)


class ReasoningGymSource(DataSource):
    """A weighted mix of reasoning-gym tasks (see the module docstring).

    Args:
        tasks: The tasks, each ``{name, weight, config, level}`` (:class:`ReasoningGymTask`).
        size: Training rows (split over the tasks by weight, largest remainders).
        seed: Seed of the training rows; the same arguments always give the same rows.
        val_size: Held-out rows (split by weight too); 0 for none.
        val_seed: Seed of the held-out rows; must differ from ``seed`` (default ``seed + 1``). A drawn
            question that is also a training question of the same task is skipped.
        test_size: Test rows (``lightning-grpo test``; split by weight too); 0 for none.
        test_seed: Seed of the test rows; must differ from ``seed`` and ``val_seed`` (default
            ``seed + 2``). A drawn question that is a training or held-out question of its task is skipped.
        system_prompt: ``None``: the prompt is the question text. Otherwise the prompt is chat
            messages, this system message then the question (needs ``data.format.use_chat_template``):
            a name in ``reasoning_gym.utils.SYSTEM_PROMPTS`` (``"default"`` asks for
            ``<answer>...</answer>``, read by the reward's ``answer_format: answer_tags``) or the text.
    """

    def __init__(
        self,
        tasks: list[ReasoningGymTask],
        size: int = 1000,
        seed: int = 0,
        val_size: int = 50,
        val_seed: int | None = None,
        system_prompt: str | None = None,
        test_size: int = 0,
        test_seed: int | None = None,
    ) -> None:
        rg = import_reasoning_gym()
        if not isinstance(tasks, (list, tuple)) or not tasks:
            raise ValueError(
                f"data.source.tasks must be a non-empty list of tasks ({{name, weight, config, level}}), got {tasks!r}"
            )
        self.tasks = [t if isinstance(t, ReasoningGymTask) else ReasoningGymTask(**t) for t in tasks]
        names = [t.name for t in self.tasks]
        if len(set(names)) != len(names):
            raise ValueError(
                f"data.source.tasks names a task twice: {names}; give each task once (one config, one weight)"
            )
        for i, task in enumerate(self.tasks):
            _check_task(task, i)
        for name, value, low in (
            ("size", size, len(self.tasks)),
            ("val_size", val_size, 0),
            ("test_size", test_size, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(
                    f"data.source.{name} must be an integer >= {low} (one row per task at least), got {value!r}"
                )
        self.size, self.seed, self.val_size, self.test_size = size, seed, val_size, test_size
        self.val_seed = seed + 1 if val_seed is None else val_seed
        if self.val_seed == seed:
            raise ValueError(
                f"data.source.val_seed must differ from seed ({seed}): held-out rows are drawn with another seed"
            )
        self.test_seed = seed + 2 if test_seed is None else test_seed
        if self.test_seed in (seed, self.val_seed):
            raise ValueError(
                f"data.source.test_seed must differ from seed ({seed}) and val_seed ({self.val_seed}): test rows are drawn with a seed of their own"
            )
        if system_prompt is not None:
            system_prompt = rg.utils.SYSTEM_PROMPTS.get(system_prompt, system_prompt)
        self.system_prompt = system_prompt
        self._train_cache: tuple[tuple, list[dict[str, Any]]] | None = None

    # ------------------------------------------------------------------------- rows
    def _draw(self, task: ReasoningGymTask, seed: int, count: int) -> list[dict[str, Any]]:
        """``count`` entries of ``task`` at its current config, drawn with ``seed``, as rows."""
        config = _config_at(task)
        dataset = import_reasoning_gym().create_dataset(task.name, seed=seed, size=max(count, 1), **config)
        return [self._row(task, dataset[i], config) for i in range(count)]

    def _row(self, task: ReasoningGymTask, entry: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
        question = entry["question"]
        prompt: Any = question
        if self.system_prompt is not None:
            prompt = [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": question}]
        return {
            "prompt": prompt,
            "question": question,
            "answer": str(entry["answer"]),
            "task": task.name,
            "metadata": entry["metadata"],
            "task_config": config,
            "level": -1 if task.level is None else task.level,
        }

    def _levels(self) -> tuple:
        return tuple(t.level for t in self.tasks)

    def train_rows(self) -> list[dict[str, Any]]:
        """``size`` rows, each task's share drawn with a seed derived from (seed, task, level), shuffled."""
        if self._train_cache is not None and self._train_cache[0] == self._levels():
            return [dict(r) for r in self._train_cache[1]]
        rows: list[dict[str, Any]] = []
        for task, count in zip(self.tasks, _quotas(self.size, [t.weight for t in self.tasks])):
            rows += self._draw(task, _derive_seed(self.seed, "train", task.name, task.level), count)
        random.Random(_derive_seed(self.seed, "train-order", *self._levels())).shuffle(rows)
        self._train_cache = (self._levels(), rows)
        return [dict(r) for r in rows]

    def val_rows(self) -> list[dict[str, Any]] | None:
        """``val_size`` rows drawn with ``val_seed``, none of whose questions is a training question
        of its task (at the current levels); ``None`` when ``val_size`` is 0."""
        if self.val_size == 0:
            return None
        return self._held_out("val", self.val_seed, self.val_size, self.train_rows())

    def test_rows(self) -> list[dict[str, Any]] | None:
        """``test_size`` rows drawn with ``test_seed``, none of whose questions is a training or held-out
        (dev) question of its task (at the current levels); ``None`` when ``test_size`` is 0."""
        if self.test_size == 0:
            return None
        return self._held_out("test", self.test_seed, self.test_size, self.train_rows() + (self.val_rows() or []))

    def _held_out(self, split: str, seed: int, size: int, exclude: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``size`` rows of ``split`` drawn with ``seed`` (split over the tasks by weight), none of whose
        questions is one of ``exclude``'s of the same task."""
        seen = {(r["task"], r["question"]) for r in exclude}
        rows: list[dict[str, Any]] = []
        for task, count in zip(self.tasks, _quotas(size, [t.weight for t in self.tasks])):
            drawn = self._draw(task, _derive_seed(seed, split, task.name, task.level), count * _VAL_DRAWS)
            fresh = [r for r in drawn if (task.name, r["question"]) not in seen]
            unique = list({r["question"]: r for r in fresh}.values())  # first draw of each question
            if len(unique) < count:
                label, others = (
                    ("held-out", "training rows") if split == "val" else ("test", "training and held-out rows")
                )
                raise ValueError(
                    f"data.source: task {task.name!r} gave only {len(unique)} distinct {label} questions outside its "
                    f"{others} in {count * _VAL_DRAWS} draws, fewer than its share {count} of {split}_size="
                    f"{size}: its question space is too small for that many (lower {split}_size or size, or "
                    "widen the task's config / level)"
                )
            rows += unique[:count]
        random.Random(_derive_seed(seed, f"{split}-order")).shuffle(rows)
        return rows

    def describe(self, split: Split) -> str:
        names = ", ".join(t.name for t in self.tasks)
        seed = {"train": self.seed, "val": self.val_seed, "test": self.test_seed}[split]
        return f"ReasoningGymSource [{names}] split {split!r} (seed {seed})"

    # -------------------------------------------------------------------- curricula
    def curriculum_tasks(self) -> list[str]:
        """The tasks that follow a curriculum (those given a ``level``)."""
        return [t.name for t in self.tasks if t.level is not None]

    def level(self, name: str) -> int:
        return self._task(name).level

    def max_level(self, name: str) -> int:
        return _max_level(self._task(name).name)

    def set_level(self, name: str, level: int) -> None:
        """Move task ``name`` to curriculum ``level``; the next :meth:`train_rows` draws at it."""
        task = self._task(name)
        if not 0 <= level <= self.max_level(name):
            raise ValueError(f"task {name!r}: level must be in [0, {self.max_level(name)}], got {level}")
        task.level = level

    def _task(self, name: str) -> ReasoningGymTask:
        for task in self.tasks:
            if task.name == name and task.level is not None:
                return task
        raise ValueError(
            f"task {name!r} follows no curriculum in this source; curriculum tasks: {self.curriculum_tasks()}"
        )


# ------------------------------------------------------------------------------------- reward
@lru_cache(maxsize=64)
def _scorer(task: str, config_json: str):
    """The reasoning-gym dataset whose ``score_answer`` checks answers of ``task`` under that config."""
    rg = import_reasoning_gym()
    return rg.create_dataset(task, **{**json.loads(config_json), "size": 1, "seed": 0})


def extract(completion: str, answer_format: str) -> str | None:
    """The answer a completion gives: the stripped text (``plain``) or the last ``<answer>`` block (else None)."""
    if answer_format == "plain":
        return completion.strip()
    from reasoning_gym.utils import extract_answer

    return extract_answer(completion)


def _as_dict(value: Any) -> dict:
    """A row's metadata / config: a dict, or its JSON text (rows read back from a file)."""
    return json.loads(value) if isinstance(value, str) else dict(value or {})


def _check_reasoning_gym(answer_format: Any = "plain", threshold: Any = None, **_kwargs: Any) -> None:
    import_reasoning_gym()
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(
            f"reward 'reasoning_gym': answer_format must be one of {ANSWER_FORMATS}, got {answer_format!r}"
        )
    if threshold is not None and (
        isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold <= 1
    ):
        raise ValueError(f"reward 'reasoning_gym': threshold must be a number in (0, 1] or null, got {threshold!r}")


@REWARDS.register("reasoning_gym")
@validated_by(_check_reasoning_gym)
def reasoning_gym_score(
    completions: list[str],
    *,
    task: Sequence[str],
    question: Sequence[str],
    answer: Sequence[Any],
    metadata: Sequence[Any],
    task_config: Sequence[Any],
    answer_format: Literal["plain", "answer_tags"] = "plain",
    threshold: float | None = None,
    **_columns: Any,
) -> list[float]:
    """The row's task's own ``score_answer(extracted answer, entry)`` in [0, 1] (partial credit where
    the task gives it); with ``threshold``, 1.0 when that score reaches it, else 0.0 (``1.0``: solved).

    Reads the columns of :class:`ReasoningGymSource` rows: ``task``, ``question``, ``answer``,
    ``metadata`` and ``task_config`` (dicts, or their JSON text).
    """
    out = []
    for c, t, q, a, m, cfg in zip(completions, task, question, answer, metadata, task_config):
        dataset = _scorer(t, json.dumps(_as_dict(cfg), sort_keys=True, default=list))
        entry = {"question": q, "answer": a, "metadata": _as_dict(m)}
        score = float(dataset.score_answer(extract(c, answer_format), entry))
        out.append(score if threshold is None else float(score >= threshold))
    return out
