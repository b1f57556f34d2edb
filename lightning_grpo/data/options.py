"""Shared by the model-backed rewards (``reward_model``, ``llm_judge``): checks of their ``kwargs``,
each raising one ``ValueError`` naming the option (``kwargs.<name>``), what was expected and what
was given; and where a batch's prompts are found."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

#: The record column holding the prompt as the data holds it (text or chat messages), before the
#: policy's chat template; ``prompt`` holds the text fed to the policy.
RAW_PROMPT = "raw_prompt"


def fail(option: str, expected: str, got: Any) -> NoReturn:
    raise ValueError(f"kwargs.{option} must be {expected}, got {got!r}")


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_int(option: str, value: Any, minimum: int, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not is_int(value) or value < minimum:
        fail(option, f"an integer >= {minimum}" + (" or null" if optional else ""), value)


def check_number(option: str, value: Any, minimum: float, strict: bool = False, unit: str = "") -> None:
    """``value`` is a finite number ``>= minimum`` (``> minimum`` when ``strict``)."""
    if not is_number(value) or value < minimum or (strict and value == minimum):
        fail(option, f"a number {'>' if strict else '>='} {minimum}{unit}", value)


def check_choice(option: str, value: Any, choices: Sequence[Any]) -> None:
    if value not in choices:
        fail(option, "one of " + ", ".join(repr(c) for c in choices), value)


def check_bool(option: str, value: Any) -> None:
    if not isinstance(value, bool):
        fail(option, "true or false", value)


def prompt_column(columns: Mapping[str, Any], column: str | None) -> str | None:
    """The column a model-backed reward reads prompts from: ``column`` when given, else
    ``raw_prompt`` when the batch has it, else ``prompt``; None when that column is absent."""
    name = column or (RAW_PROMPT if RAW_PROMPT in columns else "prompt")
    return name if name in columns else None
