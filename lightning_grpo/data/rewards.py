"""Reward functions: plain callables and a registry of built-ins (the weighted set is in ``reward_set``).

The contract: a reward function is ``fn(completions: list[str], **columns) -> list[float]``, one
finite number per completion. ``columns`` holds every dataset column aligned with the completions
(one entry per completion, e.g. ``answer``), plus what the rollout knows about each completion:
``completion_ids`` (``list[list[int]]``), ``completion_lengths`` (``list[int]``, tokens) and
``truncated`` (``list[bool]``). Configuration keywords (``pattern``, ``max_length``, ...) come from
:class:`~lightning_grpo.data.reward_set.RewardSpec` ``kwargs`` and must be named parameters of the function, so a typo is caught when
the :class:`~lightning_grpo.data.reward_set.RewardSet` is built. A function may carry a ``validate_kwargs(**kwargs)`` attribute;
the set calls it once at construction (e.g. to compile a regex or check an optional import).

Functions are looked up by registry name (:data:`REWARDS`) or by import path
(``"my_pkg.rewards.fn"`` or ``"my_pkg.rewards:fn"``), see :func:`resolve_reward`.
"""

from __future__ import annotations

import re
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch

# Importing them registers the model-backed rewards (llm_judge, reward_model; classes, built once) and
# reasoning-gym's verifiers ("reasoning_gym"; reasoning_gym itself is imported on first use).
from lightning_grpo.data import judge as _judge, reasoning_gym as _reasoning_gym, reward_models as _reward_models  # noqa: F401 - they register
from lightning_grpo.data.registry import (  # noqa: F401 - re-exported: the registry and its types, from where they were
    REWARDS,
    RewardError,
    RewardFn,
    RewardTimeoutError,
    resolve_reward,
    validated_by,
)

# ---------------------------------------------------------------------------------------- built-ins


@REWARDS.register("exact_match")
def exact_match(completions: list[str], *, answer: Sequence[Any], **_columns: Any) -> list[float]:
    """1.0 when the completion, stripped of surrounding whitespace, equals ``str(answer).strip()``."""
    return [float(c.strip() == str(a).strip()) for c, a in zip(completions, answer)]


@REWARDS.register("prefix_match")
def prefix_match(completions: list[str], *, answer: Sequence[Any], **_columns: Any) -> list[float]:
    """1.0 when the completion (leading whitespace removed) starts with ``str(answer).strip()``.

    For a one-character answer this is "the first character is right", the reward the quickstart
    measurements used; an empty answer scores 0.
    """
    out = []
    for c, a in zip(completions, answer):
        a = str(a).strip()
        out.append(float(bool(a) and c.lstrip().startswith(a)))
    return out


#: A number as a reward reads it: optional sign, digits with optional thousands commas, optional decimals.
_NUMBER = r"-?\d[\d,]*(?:\.\d+)?"
#: ``final_number``'s strict extraction: the number after the last "Answer:" (markdown bold and a "$" allowed).
_STRICT_ANSWER = re.compile(r"Answer:\s*\**\s*\$?\s*(" + _NUMBER + r")", re.IGNORECASE)


def _check_final_number(extraction: Any = "strict", **_kwargs: Any) -> None:
    if extraction not in ("strict", "lenient"):
        raise ValueError(f"reward 'final_number': extraction must be 'strict' or 'lenient', got {extraction!r}")


def extract_number(text: str, extraction: Literal["strict", "lenient"]) -> float | None:
    """The answer ``final_number`` reads: ``strict``, the number after the last "Answer:"; ``lenient``, the last
    number anywhere in the text; None when there is none."""
    found = _STRICT_ANSWER.findall(text) if extraction == "strict" else re.findall(_NUMBER, text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", "").rstrip("."))
    except ValueError:
        return None


@REWARDS.register("final_number")
@validated_by(_check_final_number)
def final_number(
    completions: list[str],
    *,
    answer: Sequence[Any],
    extraction: Literal["strict", "lenient"] = "strict",
    **_columns: Any,
) -> list[float]:
    """1.0 when the completion's answer equals the numeric ``answer``, else 0.0.

    ``extraction="strict"`` (default) reads the number after the last "Answer:" (the format a prompt asks for:
    format and value are both scored); ``"lenient"`` reads the last number anywhere in the completion (the value
    alone). Reporting both apart shows what part of a gain is format and what part is the answer. Numbers compare
    as values: "1,200", "1200" and "1200.0" are equal.
    """
    out = []
    for c, a in zip(completions, answer):
        got, gold = extract_number(c, extraction), extract_number(str(a), "lenient")
        out.append(float(got is not None and gold is not None and abs(got - gold) < 1e-9))
    return out


def _import_math_verify() -> tuple[Callable, Callable]:
    try:
        from math_verify import parse, verify
    except ImportError as err:
        raise ImportError(
            "reward 'math_accuracy' needs the math-verify package: pip install 'lightning-grpo[math]'"
        ) from err
    return parse, verify


def _check_math_accuracy(**_kwargs: Any) -> None:
    _import_math_verify()


@REWARDS.register("math_accuracy")
@validated_by(_check_math_accuracy)
def math_accuracy(completions: list[str], *, answer: Sequence[Any], **_columns: Any) -> list[float]:
    """1.0 when math-verify finds the completion's answer equal to the gold ``answer``, else 0.0.

    Both sides go through ``math_verify.parse`` (LaTeX, ``\\boxed{}`` and plain expressions), then
    ``math_verify.verify(gold, prediction)``. math-verify times out with ``signal.alarm``, which
    only works in the main thread; in another thread (e.g. under ``RewardSpec.timeout_s``) its own
    timeouts are switched off and the spec's timeout is the guard. A gold answer that does not
    parse scores 0.0 with a warning.
    """
    parse, verify = _import_math_verify()
    main = threading.current_thread() is threading.main_thread()
    parse_kw = {} if main else {"parsing_timeout": None}
    verify_kw = {} if main else {"timeout_seconds": None}
    out = []
    for c, a in zip(completions, answer):
        gold = parse(str(a), **parse_kw)
        if not gold:
            warnings.warn(f"math_accuracy: gold answer {str(a)[:60]!r} does not parse; scored 0.0", stacklevel=2)
            out.append(0.0)
            continue
        out.append(float(verify(gold, parse(c, **parse_kw), **verify_kw)))
    return out


def _check_regex_format(pattern: Any = None, match: str = "fullmatch", **_kwargs: Any) -> None:
    if not isinstance(pattern, str):
        raise ValueError(f"reward 'regex_format' needs kwargs.pattern (a regex string), got {pattern!r}")
    if match not in ("fullmatch", "search"):
        raise ValueError(f"reward 'regex_format': match must be 'fullmatch' or 'search', got {match!r}")
    try:
        re.compile(pattern, re.DOTALL)
    except re.error as err:
        raise ValueError(f"reward 'regex_format': pattern {pattern!r} is not a valid regex: {err}") from err


@REWARDS.register("regex_format")
@validated_by(_check_regex_format)
def regex_format(
    completions: list[str],
    *,
    pattern: str,
    match: Literal["fullmatch", "search"] = "fullmatch",
    **_columns: Any,
) -> list[float]:
    """1.0 when ``pattern`` matches the completion, else 0.0.

    ``match="fullmatch"`` (default) uses ``re.fullmatch`` (the whole completion must match);
    ``"search"`` uses ``re.search`` (anywhere). The pattern is compiled with ``re.DOTALL`` so
    ``.`` also matches newlines.
    """
    regex = re.compile(pattern, re.DOTALL)
    test = regex.fullmatch if match == "fullmatch" else regex.search
    return [float(test(c) is not None) for c in completions]


def _check_soft_overlong(max_length: Any = None, cache_length: Any = None, **_kwargs: Any) -> None:
    if not isinstance(max_length, int) or not isinstance(cache_length, int):
        raise ValueError(
            "reward 'soft_overlong' needs integer kwargs max_length and cache_length "
            f"(e.g. {{max_length: 1024, cache_length: 256}}), got max_length={max_length!r}, "
            f"cache_length={cache_length!r}"
        )
    if not 0 <= cache_length <= max_length or max_length <= 0:
        raise ValueError(
            f"reward 'soft_overlong' needs 0 <= cache_length <= max_length and max_length > 0, got "
            f"cache_length={cache_length}, max_length={max_length}"
        )


@REWARDS.register("soft_overlong")
@validated_by(_check_soft_overlong)
def soft_overlong(
    completions: list[str],
    *,
    completion_lengths: Sequence[int],
    max_length: int,
    cache_length: int,
    **_columns: Any,
) -> list[float]:
    """DAPO soft overlong punishment of ``completion_lengths``, in [-1, 0].

    0 up to ``max_length - cache_length`` tokens, then falling linearly to -1 at ``max_length``, and
    -1 beyond (:func:`lightning_grpo.core.shaping.soft_overlong_punishment`).
    """
    from lightning_grpo.core.shaping import soft_overlong_punishment

    lengths = torch.as_tensor([int(n) for n in completion_lengths], dtype=torch.long)  # [B]
    return soft_overlong_punishment(lengths, max_length, cache_length).tolist()


def _check_length(max_length: Any = None, **_kwargs: Any) -> None:
    if max_length is not None and (not isinstance(max_length, int) or max_length <= 0):
        raise ValueError(f"reward 'length': max_length must be a positive integer or null, got {max_length!r}")


@REWARDS.register("length")
@validated_by(_check_length)
def length(
    completions: list[str],
    *,
    completion_lengths: Sequence[int],
    max_length: int | None = None,
    **_columns: Any,
) -> list[float]:
    """The completion length in tokens, divided by ``max_length`` when given (so in [0, 1]).

    It rewards length; give it a negative weight to penalise length instead.
    """
    return [float(n) / max_length if max_length else float(n) for n in completion_lengths]


# ---------------------------------------------------------------- multi-turn episodes (agents)
# Besides the dataset columns, reward functions of episodes receive (one entry per episode): ``transcript``
# (the chat messages, or the decoded text of a plain-text episode), ``env_reward`` (the sum of the
# environment's per-turn rewards), ``turns`` (model turns), ``tool_calls`` (calls that ran and returned),
# ``environments`` (each episode's environment object, after ``finish``: what TRL's reward functions read; an
# adapter's wrapped object, see :mod:`lightning_grpo.integrations`), and ``completion_lengths`` counts sampled
# tokens only. The ``completions`` are the text of each episode's last model turn (its final answer).
@REWARDS.register("env_reward")
def env_reward(completions: list[str], env_reward: Sequence[float]) -> list[float]:
    """The environment's reward of each episode (sum over turns; ``lightning_grpo.agents``)."""
    return [float(r) for r in env_reward]


@REWARDS.register("tool_call_made")
def tool_call_made(
    completions: list[str], tool_calls: Sequence[int], truncated: Sequence[bool], require_answer: bool = True
) -> list[float]:
    """1 when the episode made at least one tool call that ran and returned, else 0 (a format reward).

    ``require_answer``: only episodes that also ended with an answer (not truncated by
    ``max_turns`` / a length limit) count, so calling again and again is not rewarded."""
    return [1.0 if n > 0 and not (require_answer and t) else 0.0 for n, t in zip(tool_calls, truncated)]
