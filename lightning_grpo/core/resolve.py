"""Name-or-import-path lookup shared by the user-pluggable pieces (reward functions, environments)."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

from .registry import Registry


def resolve_callable(name: str | Callable, registry: Registry | None, what: str, example: str) -> Callable:
    """The callable registered in ``registry`` as ``name``, or imported from ``"pkg.mod.obj"`` /
    ``"pkg.mod:obj"``; a callable is returned unchanged. ``registry`` None: import paths only.

    ``what`` names the kind in errors (``"reward function"``), ``example`` is an import path shown
    when the name is unknown. Raises ``ValueError`` naming the string when it is neither registered
    nor importable, ``TypeError`` when the imported object is not callable.
    """
    if callable(name):
        return name
    if not isinstance(name, str) or not name:
        kind = "an import path" if registry is None else "a registry name or an import path"
        raise ValueError(f"{what} must be {kind}, got {name!r}")
    if registry is not None and name in registry:
        return registry.get(name)
    if ":" in name:
        module_name, _, attr_path = name.partition(":")
    elif "." in name:
        module_name, _, attr_path = name.rpartition(".")
    elif registry is None:
        raise ValueError(f"{what} {name!r} is not an import path; give one like {example}")
    else:
        raise ValueError(
            f"unknown {what} {name!r}; registered: {', '.join(registry.names())}; or give an import path like {example}"
        )
    try:
        obj: Any = importlib.import_module(module_name)
        for attr in attr_path.split("."):
            obj = getattr(obj, attr)
    except (ImportError, AttributeError, ValueError) as err:
        raise ValueError(f"{what} {name!r} could not be imported: {err}{_search_path_hint(err, module_name)}") from err
    if not callable(obj):
        raise TypeError(f"{what} {name!r} resolves to a {type(obj).__name__}, which is not callable")
    return obj


def _search_path_hint(err: BaseException, module_name: str) -> str:
    """Where Python looked, when the module itself (not one it imports) was not found: the current folder
    and ``PYTHONPATH`` (the ``lightning-grpo`` command puts the current folder on ``sys.path``)."""
    top = module_name.split(".")[0]
    if not isinstance(err, ModuleNotFoundError) or err.name != top:
        return ""
    return (
        f"; the current folder is {os.getcwd()}: {top} must be importable from it or from PYTHONPATH (run from "
        f"the folder that holds {top}.py, or e.g. PYTHONPATH=path/to/that/folder lightning-grpo fit ...)"
    )
