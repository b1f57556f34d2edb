"""Reward functions: plain callables, a registry of built-ins, and a weighted set that scores a batch.

The contract: a reward function is ``fn(completions: list[str], **columns) -> list[float]``, one
finite number per completion. ``columns`` holds every dataset column aligned with the completions
(one entry per completion, e.g. ``answer``), plus what the rollout knows about each completion:
``completion_ids`` (``list[list[int]]``), ``completion_lengths`` (``list[int]``, tokens) and
``truncated`` (``list[bool]``). Configuration keywords (``pattern``, ``max_length``, ...) come from
:class:`RewardSpec.kwargs` and must be named parameters of the function, so a typo is caught when
the :class:`RewardSet` is built. A function may carry a ``validate_kwargs(**kwargs)`` attribute;
the set calls it once at construction (e.g. to compile a regex or check an optional import).

Functions are looked up by registry name (:data:`REWARDS`) or by import path
(``"my_pkg.rewards.fn"`` or ``"my_pkg.rewards:fn"``), see :func:`resolve_reward`.
"""

from __future__ import annotations

import importlib
import inspect
import math
import numbers
import re
import threading
import warnings
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, NamedTuple, Sequence

import torch

from lightning_grpo.core.registry import Registry

RewardFn = Callable[..., Sequence[float]]

REWARDS: Registry = Registry("reward function")


class RewardError(RuntimeError):
    """A reward function failed or returned something that is not one finite number per completion."""


class RewardTimeoutError(RewardError):
    """A reward function did not finish within its ``timeout_s``."""


def resolve_reward(name: str | RewardFn) -> RewardFn:
    """The reward function registered as ``name``, or imported from ``"pkg.mod.fn"`` / ``"pkg.mod:fn"``.

    A callable is returned unchanged. Raises ``ValueError`` naming the string when it is neither
    registered nor importable, and ``TypeError`` when the imported object is not callable.
    """
    if callable(name):
        return name
    if not isinstance(name, str) or not name:
        raise ValueError(f"reward function name must be a non-empty string, got {name!r}")
    if name in REWARDS:
        return REWARDS.get(name)
    if ":" in name:
        module_name, _, attr_path = name.partition(":")
    elif "." in name:
        module_name, _, attr_path = name.rpartition(".")
    else:
        raise ValueError(
            f"unknown reward function {name!r}; registered: {', '.join(REWARDS.names())}; "
            "or give an import path like 'my_pkg.rewards.fn' or 'my_pkg.rewards:fn'"
        )
    try:
        obj: Any = importlib.import_module(module_name)
        for attr in attr_path.split("."):
            obj = getattr(obj, attr)
    except (ImportError, AttributeError, ValueError) as err:
        raise ValueError(f"reward function {name!r} could not be imported: {err}") from err
    if not callable(obj):
        raise TypeError(f"reward function {name!r} resolves to a {type(obj).__name__}, which is not callable")
    return obj


def _validated_by(check: Callable[..., None]) -> Callable[[RewardFn], RewardFn]:
    """Attach ``check`` as the function's ``validate_kwargs`` (called once by :class:`RewardSet`)."""

    def decorator(fn: RewardFn) -> RewardFn:
        fn.validate_kwargs = check  # type: ignore[attr-defined]
        return fn

    return decorator


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
@_validated_by(_check_math_accuracy)
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
@_validated_by(_check_regex_format)
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
@_validated_by(_check_soft_overlong)
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
@_validated_by(_check_length)
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


# ---------------------------------------------------------------------------------------- the set


@dataclass
class RewardSpec:
    """One reward function of a :class:`RewardSet`, as written in a recipe."""

    name: str | Callable[..., Sequence[float]]
    """Registry name (see ``REWARDS``), import path ``"pkg.module.fn"`` / ``"pkg.module:fn"``, or the
    function itself (drop-in use from Python)."""
    weight: float = 1.0
    """Weight of this reward in the weighted sum (used by the reward aggregation)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments passed on every call (e.g. ``pattern`` for ``regex_format``)."""
    timeout_s: float | None = None
    """Seconds one call (the whole batch) may take; ``None`` runs it inline without a limit."""
    on_timeout: Literal["raise", "zero"] = "raise"
    """On timeout: ``"raise"`` a :class:`RewardTimeoutError`, or score the batch 0 and count it."""
    alias: str | None = None
    """Name in logs; defaults to ``name`` after its last ``.`` or ``:``. Must be unique in a set."""

    def __post_init__(self) -> None:
        if not isinstance(self.weight, (int, float)) or not math.isfinite(self.weight):
            raise ValueError(f"reward {self.name!r}: weight must be a finite number, got {self.weight!r}")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"reward {self.name!r}: timeout_s must be > 0 or null, got {self.timeout_s!r}")
        if self.on_timeout not in ("raise", "zero"):
            raise ValueError(f"reward {self.name!r}: on_timeout must be 'raise' or 'zero', got {self.on_timeout!r}")

    @property
    def label(self) -> str:
        if self.alias:
            return self.alias
        if callable(self.name):
            return getattr(self.name, "__name__", type(self.name).__name__)
        return re.split(r"[.:]", self.name)[-1]


@dataclass
class RewardScores:
    """What :meth:`RewardSet.score` returns for one batch."""

    rewards: torch.Tensor
    """``[B, R]`` float32: column r is reward function r's score of each completion."""
    weights: torch.Tensor
    """``[R]`` float32: each function's weight."""
    names: list[str]
    """``[R]`` the functions' log names."""
    timed_out: list[bool]
    """``[R]`` whether function r timed out on this batch (and was scored 0)."""

    def metrics(self, prefix: str = "reward/") -> dict[str, float]:
        """``{prefix}{name}/mean`` and ``/std`` (population) per function, ``/timeout`` if it timed out."""
        out: dict[str, float] = {}
        for r, name in enumerate(self.names):
            col = self.rewards[:, r]  # [B]
            out[f"{prefix}{name}/mean"] = col.mean().item() if col.numel() else 0.0
            out[f"{prefix}{name}/std"] = col.std(correction=0).item() if col.numel() else 0.0
            if self.timed_out[r]:
                out[f"{prefix}{name}/timeout"] = 1.0
        return out


def _call_with_timeout(fn: RewardFn, timeout_s: float | None, args: tuple, kwargs: dict) -> Any:
    """``fn(*args, **kwargs)``, waiting at most ``timeout_s`` (raises ``TimeoutError``).

    Runs in a daemon thread behind a ``Future``: a call that never returns cannot be killed, but
    it is left behind without blocking the interpreter's exit.
    """
    if timeout_s is None:
        return fn(*args, **kwargs)
    future: Future = Future()

    def target() -> None:
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as err:  # noqa: BLE001 - re-raised by future.result()
                future.set_exception(err)

    threading.Thread(target=target, name="reward-timeout", daemon=True).start()
    try:
        return future.result(timeout=timeout_s)
    except TimeoutError:
        if future.done():  # the function itself raised TimeoutError
            raise
        raise _Expired() from None


class _Expired(Exception):
    """Internal marker: the call did not finish in time."""


def _prefix(text: str, n: int = 40) -> str:
    return repr(text[:n] + ("..." if len(text) > n else ""))


class _Params(NamedTuple):
    """What :class:`RewardSet` needs to know about a reward function's signature."""

    named: set[str]  # keyword-passable parameters after ``completions``
    required: set[str]  # those without a default
    takes_all: bool  # has ``**columns``: receives every column, not only the named ones


def _params(fn: RewardFn) -> _Params | None:
    """The signature summary of ``fn``, or None when it cannot be inspected (then nothing is checked)."""
    try:
        params = list(inspect.signature(fn).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    named = {p.name for p in params if p.kind in kinds}
    required = {p.name for p in params if p.kind in kinds and p.default is inspect.Parameter.empty}
    return _Params(named, required, any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params))


class RewardSet:
    """Several weighted reward functions that score a batch of completions into a ``[B, R]`` tensor."""

    def __init__(self, specs: Sequence[RewardSpec | Mapping[str, Any]]) -> None:
        """Resolve every function and check its kwargs (errors here, before any rollout)."""
        self.specs = [s if isinstance(s, RewardSpec) else RewardSpec(**s) for s in specs]
        if not self.specs:
            raise ValueError("RewardSet needs at least one reward function")
        self.fns = [resolve_reward(s.name) for s in self.specs]
        self.names = [s.label for s in self.specs]
        duplicates = sorted({n for n in self.names if self.names.count(n) > 1})
        if duplicates:
            raise ValueError(f"reward names must be unique; give an alias to the repeated {duplicates}")
        self._params = [_params(fn) for fn in self.fns]
        for spec, fn, params in zip(self.specs, self.fns, self._params):
            unknown = sorted(set(spec.kwargs) - params.named) if params else []
            if unknown:
                raise ValueError(
                    f"reward {spec.label!r}: unknown kwargs {unknown}; its named parameters are {sorted(params.named)}"
                )
            check = getattr(fn, "validate_kwargs", None)
            if check is not None:
                check(**spec.kwargs)
        #: Timed-out calls per function name since construction (``on_timeout="zero"``).
        self.timeout_counts: dict[str, int] = {n: 0 for n in self.names}
        self.weights = torch.tensor([float(s.weight) for s in self.specs], dtype=torch.float32)  # [R]

    def _check_inputs(self, completions: Sequence[str], columns: Mapping[str, Any]) -> None:
        batch = len(completions)
        for key, value in columns.items():
            size = len(value) if hasattr(value, "__len__") else None
            if size != batch:
                raise ValueError(
                    f"column {key!r} has {size} entries for {batch} completions; expected one per completion"
                )
        for spec, params in zip(self.specs, self._params):
            shadowed = sorted(set(spec.kwargs) & set(columns))
            if shadowed:
                raise ValueError(f"reward {spec.label!r}: kwargs {shadowed} shadow data columns of the same name")
            missing = sorted(params.required - set(spec.kwargs) - set(columns)) if params else []
            if missing:
                raise ValueError(
                    f"reward {spec.label!r} needs {missing}, found neither in its kwargs nor in the columns "
                    f"{sorted(columns)}"
                )

    def score(self, completions: Sequence[str], columns: Mapping[str, Any] | None = None) -> RewardScores:
        """Score ``completions`` (``[B]``) with every function; ``columns`` are aligned with them."""
        completions = list(completions)
        columns = dict(columns or {})
        self._check_inputs(completions, columns)
        scores: list[list[float]] = []
        timed_out: list[bool] = []
        for spec, fn, params in zip(self.specs, self.fns, self._params):
            # A function without **columns receives only the columns it names.
            own = columns
            if params is not None and not params.takes_all:
                own = {k: v for k, v in columns.items() if k in params.named}
            values, expired = self._score_one(spec, fn, completions, own)
            scores.append(values)
            timed_out.append(expired)
        rewards = torch.tensor(scores, dtype=torch.float32).reshape(len(scores), len(completions)).T  # [B, R]
        return RewardScores(rewards.contiguous(), self.weights.clone(), list(self.names), timed_out)

    def _score_one(
        self, spec: RewardSpec, fn: RewardFn, completions: list[str], columns: dict[str, Any]
    ) -> tuple[list[float], bool]:
        try:
            out = _call_with_timeout(fn, spec.timeout_s, (completions,), {**columns, **spec.kwargs})
        except _Expired:
            if spec.on_timeout == "raise":
                raise RewardTimeoutError(
                    f"reward function {spec.label!r} did not finish within timeout_s={spec.timeout_s} on a batch "
                    f"of {len(completions)} completions (set on_timeout='zero' to score 0 instead)"
                ) from None
            self.timeout_counts[spec.label] += 1
            return [0.0] * len(completions), True
        except Exception as err:
            raise self._locate_failure(spec, fn, completions, columns, err) from err
        return self._check_output(spec.label, out, completions), False

    def _locate_failure(
        self, spec: RewardSpec, fn: RewardFn, completions: list[str], columns: dict[str, Any], err: Exception
    ) -> RewardError:
        """Re-run the failed call one completion at a time to name the first sample that fails."""
        what = f"{type(err).__name__}: {err}"
        for i, text in enumerate(completions):
            one = {k: v[i : i + 1] for k, v in columns.items()}
            try:
                _call_with_timeout(fn, spec.timeout_s, ([text],), {**one, **spec.kwargs})
            except _Expired:
                continue
            except Exception:  # noqa: BLE001 - this is the sample we are looking for
                return RewardError(
                    f"reward function {spec.label!r} raised {what} on sample {i} (completion {_prefix(text)})"
                )
        return RewardError(
            f"reward function {spec.label!r} raised {what} on a batch of {len(completions)} completions "
            "(no single completion reproduces it)"
        )

    @staticmethod
    def _check_output(label: str, out: Any, completions: list[str]) -> list[float]:
        if isinstance(out, torch.Tensor):
            out = out.tolist()
        expected = len(completions)
        if isinstance(out, (str, bytes, Mapping)) or not hasattr(out, "__len__"):
            raise RewardError(
                f"reward function {label!r} returned a {type(out).__name__}; expected a list of {expected} numbers"
            )
        if len(out) != expected:
            raise RewardError(
                f"reward function {label!r} returned the wrong number of scores: expected {expected}, got {len(out)}"
            )
        values = []
        for i, v in enumerate(out):
            if not isinstance(v, numbers.Real):
                raise RewardError(
                    f"reward function {label!r} returned a non-number {v!r} ({type(v).__name__}) at index {i} "
                    f"(completion {_prefix(completions[i])})"
                )
            if not math.isfinite(float(v)):
                raise RewardError(
                    f"reward function {label!r} returned {float(v)} at index {i} "
                    f"(completion {_prefix(completions[i])}); scores must be finite"
                )
            values.append(float(v))
        return values
