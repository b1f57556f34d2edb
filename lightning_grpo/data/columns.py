"""The prompt and answer columns of the rows: the fix for one that is missing (the columns that look like
it), and each answer as the text the reward functions receive.

A missing column is answered with the columns the data has that look like it: by name (``question``,
``problem``, ... for the prompt; ``solution``, ``target``, ... for the answer), else, for the prompt, by
value (the columns holding text or chat messages)::

    data.format.prompt_column 'prompt' not found in data.train_files qa.jsonl; columns present:
    ['question', 'answer']; set data.format.prompt_column: question

An answer reaches the records (and so the reward functions) as text (`answer_text`): a number as it is
written (``8`` -> ``"8"``; ``8.0``, which the data reader makes of an ``8`` in a column that also holds
``2.5``, -> ``"8"``), true / false as ``"true"`` / ``"false"``, and a missing one (null, NaN) as ``None``.
A list or a dict has no one text: `check_answers` refuses it before any record is built.
"""

from __future__ import annotations

import math
from typing import Any

#: Parts of column names that mark a column as the prompt / the answer (matched in the lower-cased name).
PROMPT_NAMES = ("question", "problem", "query", "prompt", "instruction", "input", "message", "conversation", "text")
ANSWER_NAMES = ("answer", "solution", "target", "label", "truth", "gold", "output", "result", "expected", "reference")
#: Below this a float with a whole value is written without its ``.0`` (larger ones are not exact integers).
_WHOLE_FLOATS = 2**53


def _looks_like_prompt(value: Any) -> bool:
    return isinstance(value, str) or (
        isinstance(value, list) and bool(value) and all(isinstance(m, dict) for m in value)
    )


def column_candidates(kind: str, rows: list[dict[str, Any]], exclude: tuple[str | None, ...] = ()) -> list[str]:
    """The columns of ``rows`` that look like the ``kind`` ("prompt" or "answer") column, in the data's
    order: those named like it, else (for the prompt) those holding text or chat messages."""
    present = [c for c in rows[0] if c not in exclude] if rows else []
    stems = PROMPT_NAMES if kind == "prompt" else ANSWER_NAMES
    named = [c for c in present if any(stem in str(c).lower() for stem in stems)]
    if kind == "prompt":
        named = [c for c in named if _looks_like_prompt(rows[0][c])]
        return named or [c for c in present if _looks_like_prompt(rows[0][c])]
    return named


def column_fix(option: str, kind: str, rows: list[dict[str, Any]], exclude: tuple[str | None, ...] = ()) -> str:
    """``set data.format.<option>: <column>`` naming the one candidate (`column_candidates`), or the
    candidates when there are several, or what the column must hold when there is none."""
    candidates = column_candidates(kind, rows, exclude)
    if len(candidates) == 1:
        return f"set data.format.{option}: {candidates[0]}"
    fix = f"set data.format.{option} to the column that holds the {kind}s"
    return f"{fix}, one of {candidates}" if candidates else fix


def check_answers(rows: list[dict[str, Any]], column: str, source: str) -> None:
    """Every answer of ``column`` has a text (`answer_text`): no list or dict (one error naming the row)."""
    for i, row in enumerate(rows):
        value = row.get(column)
        if isinstance(value, (list, dict, tuple)):
            kind = "dict" if isinstance(value, dict) else "list"
            raise ValueError(
                f"data.format.answer_column {column!r} of {source} holds a {kind} in row {i} ({_short(value)}); "
                "answers reach the reward functions as text: write each answer as one string, or set "
                f"data.format.answer_column: null (the column {column!r} still reaches the reward functions by "
                f"name, as a {kind})"
            )


def answer_text(value: Any) -> str | None:
    """The answer as the reward functions receive it (see the module docstring): text, or ``None`` when missing."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if value.is_integer() and abs(value) < _WHOLE_FLOATS:
            return str(int(value))
        return repr(value)
    return str(value)


def _short(value: Any, n: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= n else text[: n - 3] + "..."
