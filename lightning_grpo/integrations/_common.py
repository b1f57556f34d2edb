"""Helpers shared by the adapters: optional imports, import paths, coroutines from sync code."""

from __future__ import annotations

import asyncio
import functools
import importlib
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any

from lightning_grpo.core.registry import Registry
from lightning_grpo.core.resolve import resolve_callable

_NO_NAMES: Registry = Registry("adapter argument")  # adapters take import paths only


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
