"""Helpers shared by the adapters: optional imports, import paths, coroutines from sync code, session timeouts."""

from __future__ import annotations

import asyncio
import functools
import importlib
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from lightning_grpo.core.registry import Registry
from lightning_grpo.core.resolve import resolve_callable

_NO_NAMES: Registry = Registry("adapter argument")  # adapters take import paths only


@dataclass(frozen=True)
class SessionTimeouts:
    """How long a remote environment's session may take (``environment_args.timeouts``)."""

    connect_s: float = 10.0
    """Seconds to open a session."""
    message_s: float = 60.0
    """Seconds to wait for each reset / step answer."""

    def __post_init__(self) -> None:
        for name in ("connect_s", "message_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"timeouts.{name} must be a number of seconds > 0, got {value!r}")

    @classmethod
    def of(cls, value: SessionTimeouts | dict[str, float]) -> SessionTimeouts:
        """``value`` as settings: an instance as is, a mapping of its fields (as a recipe writes it) built into one."""
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = sorted(set(value) - {"connect_s", "message_s"})
            if unknown:
                raise ValueError(f"timeouts: unknown field(s) {', '.join(unknown)}; valid: connect_s, message_s")
            return cls(**value)
        raise TypeError(f"timeouts must be a SessionTimeouts or a mapping of its fields, got {type(value).__name__}")


def require(module: str, extra: str, what: str) -> ModuleType:
    """``import module``, or one ImportError naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"{what} needs the optional package that provides {module!r}: pip install 'lightning-grpo[{extra}]' ({err})"
        ) from err


def resolve(spec: str | Callable[..., Any], what: str, example: str) -> Callable[..., Any]:
    """A class or function given as itself or as an import path ``"pkg.mod.Name"`` / ``"pkg.mod:Name"``."""
    if isinstance(spec, str) and "." not in spec and ":" not in spec:
        raise ValueError(f"{what} {spec!r} is not an import path; give one like {example}")
    return resolve_callable(spec, _NO_NAMES, what, example)


def optional(spec: str | Callable[..., Any] | None, what: str, example: str) -> Callable[..., Any] | None:
    """:func:`resolve`, passing None through."""
    return None if spec is None else resolve(spec, what, example)


def run_sync(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` to completion from synchronous code: on a fresh event loop, in a worker thread when
    this thread already runs one (a notebook, an async caller), since a running loop cannot be re-entered."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="lightning-grpo-async") as pool:
        return pool.submit(asyncio.run, coro).result()


def synchronous(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` itself, or for a coroutine function a plain function with the same signature and docstring
    (tool schemas read both) that runs it with :func:`run_sync`."""
    if not asyncio.iscoroutinefunction(fn):
        return fn

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        return run_sync(fn(*args, **kwargs))

    return call
