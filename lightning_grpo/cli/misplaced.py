"""The key a misplaced option was meant to be: the same name one level down, one level up, or in a sibling
group, among the keys the parser knows (jsonargparse's own: the subcommand's options and, for an option that
takes a class, that class's options as ``--<key>.help`` lists them)::

    rollout.max_new_tokens: not an option of lightning_grpo.RolloutCallback (did you mean rollout.sampling.max_new_tokens?)
    rollout.sampling.engine: not an option of lightning_grpo.SamplingConfig (did you mean rollout.engine?)

A YAML key dedented out of its group, or indented into one, is the usual cause.
"""

from __future__ import annotations

import importlib
import inspect
import re
import typing
from typing import Any

_CLASS = re.compile(r"Problem with given class_path '([^']+)'")
_KEY = re.compile(r'Parser key "([^"]+)"')
#: Actions of every parser that are not options of the configuration.
_NOT_KEYS = {"help", "config", "print_config"}
#: More candidates than this are no suggestion.
_MAX_CANDIDATES = 3


def misplaced_key_hint(key: str, parser: Any, message: str) -> str:
    """`` (did you mean <key>?)`` naming the valid keys with ``key``'s last name one level down, one level
    up or in a sibling group of ``key``'s (see the module docstring); '' when there is none."""
    if parser is None or not key:
        return ""
    found = near_keys(key, valid_keys(parser, key, message))
    if not found or len(found) > _MAX_CANDIDATES:
        return ""
    return f" (did you mean {' or '.join(found)}?)"


def near_keys(key: str, keys: set[str]) -> list[str]:
    """The keys of ``keys`` that end in ``key``'s name, one level down (``parent.X.name``), one level up
    (``grandparent.name``) or in a sibling group (``grandparent.X.name``) of ``key``; sorted."""
    parent, _, name = key.rpartition(".")
    grand = parent.rpartition(".")[0]
    found = []
    for candidate in keys - {key}:
        group, _, last = candidate.rpartition(".")
        if last != name:
            continue
        down = bool(group) and group.rpartition(".")[0] == parent
        up_or_sibling = bool(parent) and (group == grand or (bool(group) and group.rpartition(".")[0] == grand))
        if down or up_or_sibling:
            found.append(candidate)
    return sorted(found)


def valid_keys(parser: Any, key: str, message: str) -> set[str]:
    """Every option key of ``parser`` (and its subcommands' parsers), with the options of the class taken by
    the option ``key`` lies under (the ``class_path`` the message names for it, else its type's class)."""
    parsers = [parser]
    sub = getattr(parser, "_subcommands_action", None)  # jsonargparse / argparse internals (third-party)
    if sub is not None:
        # jsonargparse / argparse internals (third-party)
        parsers += list(getattr(sub, "_name_parser_map", {}).values())
    given = _given_class(message)
    keys: set[str] = set()
    for p in parsers:
        for action in getattr(p, "_actions", []):  # jsonargparse / argparse internals (third-party)
            dest = getattr(action, "dest", "")  # jsonargparse / argparse internals (third-party)
            if not dest or dest in _NOT_KEYS or dest.endswith(".help"):
                continue
            keys.add(dest)
            if key.startswith(dest + "."):
                # jsonargparse / argparse internals (third-party)
                cls = given.get(dest) or _class_of(getattr(action, "_typehint", None))
                keys |= class_keys(cls, dest) if cls is not None else set()
    return keys


def class_keys(cls: type, prefix: str) -> set[str]:
    """The option keys jsonargparse gives ``cls`` under ``prefix`` (its parameters and their dataclass fields)."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    try:
        parser.add_class_arguments(cls, prefix, fail_untyped=False, sub_configs=True)
    except Exception:  # noqa: BLE001 - a suggestion is optional
        return set()
    return {a.dest for a in parser._actions if a.dest not in _NOT_KEYS and not a.dest.endswith(".help")}


def _given_class(message: str) -> dict[str, type]:
    """{the parser key: the class its ``class_path`` names} when the message holds both."""
    key, path = _KEY.search(message), _CLASS.search(message)
    if key is None or path is None:
        return {}
    module_name, _, name = path.group(1).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except Exception:  # noqa: BLE001 - a suggestion is optional
        return {}
    return {key.group(1): cls} if inspect.isclass(cls) else {}


def _class_of(typehint: Any) -> type | None:
    """The one class of a type hint (``RolloutCallback``, ``Optional[RolloutCallback]``), else None."""
    options = typing.get_args(typehint) or (typehint,)
    classes = [t for t in options if inspect.isclass(t) and t is not type(None)]
    return classes[0] if len(classes) == 1 and typing.get_origin(classes[0]) is None else None
