"""One useful line out of a configuration error.

jsonargparse reports a bad value inside a ``class_path`` / ``Optional`` option as a tree: every
``Union`` alternative with its own error (``Expected a <class 'NoneType'>`` for the ``None`` of
every optional option), then the whole given value (``Given value: Namespace(...)``, several KB
for a loss or a callback). :func:`condense` keeps the option's dotted key, the innermost error and
the class it belongs to, and suggests the closest option name for a misspelled one::

    rollout.sampling: option 'm' is not accepted by lightning_grpo.SamplingConfig (did you mean 'n'?)

Errors the CLI raises before training (instantiation, the run plan's checks) are marked with
:func:`mark` and printed by :func:`print_and_exit` as that one line, without a traceback.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import re
import sys
from typing import Any, NoReturn

from .misplaced import misplaced_key_hint

_STRUCTURE = (
    "Does not validate against any of the Union subtypes",
    "Subtypes:",
    "Errors:",
    "Given value type:",
    "Given value:",
)
_NONE_ALTERNATIVE = re.compile(r"^-?\s*Expected a <class 'NoneType'>")
_KEY = re.compile(r'^-?\s*Parser key "([^"]+)":\s*(.*)$')
_CLASS = re.compile(r"^-?\s*Problem with given class_path '([^']+)':\s*(.*)$")
_GIVEN = re.compile(r"^Given value: (.*)$")
_GIVEN_CLASS = re.compile(r"class_path='([^']+)'")
_NOT_ACCEPTED = re.compile(r"[Oo]ption '([^']+)' is not accepted")
_GROUP_OPTION = re.compile(r"(Group|Subcommand) '([^']+)' does not accept option '([^']+)'")
_MARK = "_lightning_grpo_config_error"
_DID_YOU_MEAN = re.compile(r" \(did you mean '[^']*'\?\)$")
#: The package's own types (``jsonargparse.typing.register_type``) explain a bad value in full: kept alone.
_OWN_TYPE = re.compile(r"Not of type (?:RewardName): (.*)$")


def _pretty(text: str) -> str:
    """``Expected a <class 'int'>`` -> ``expected an int``; typing prefixes dropped."""
    text = re.sub(r"<class '(?:[\w.]+\.)?(\w+)'>", r"\1", text)
    text = re.sub(r"\btyping\.", "", text)
    text = re.sub(r"^Expected a ([aeiou])", r"expected an \1", text)
    return re.sub(r"^Expected a ", "expected a ", text)


def _parameters(class_path: str) -> list[str]:
    """The constructor parameters (or dataclass fields) of ``class_path``; [] when it cannot be imported."""
    module_name, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except Exception:  # noqa: BLE001 - a suggestion is optional
        return []
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return []
    names = [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    for base in cls.__mro__[1:]:  # a class whose **kwargs go to its base class
        if any(p.kind is p.VAR_KEYWORD for p in params) and base is not object and "__init__" in vars(base):
            names += [p for p in _parameters(f"{base.__module__}.{base.__qualname__}") if p not in names]
            break
    return names


def _nested_parameters(class_path: str) -> list[str]:
    """``_parameters`` plus ``param.field`` for each parameter whose default is a dataclass (``sampling.n``)."""
    names = _parameters(class_path)
    module_name, _, name = class_path.rpartition(".")
    try:
        params = inspect.signature(getattr(importlib.import_module(module_name), name)).parameters
    except Exception:  # noqa: BLE001 - a suggestion is optional
        return names
    for param in params.values():
        if dataclasses.is_dataclass(param.default):
            names += [f"{param.name}.{f.name}" for f in dataclasses.fields(param.default)]
    return names


def _suggest(name: str, options: list[str]) -> str:
    close = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def condense(message: str, parser: Any = None, config: Any = None) -> str:
    """The one line that says which option is wrong and why (see the module docstring).

    ``parser``: the parser that failed (suggests group options); ``config``: the parsed config (finds
    the key of a ``class_path`` when the message names none, as instantiation errors do)."""
    line = _condense(message, parser, config)
    key, sep, text = line.partition(": ")
    if not (sep and "not an option" in text):
        return line
    hint = misplaced_key_hint(key, parser, message)  # the same name one level down / up: a YAML indent slip
    return _DID_YOU_MEAN.sub("", line) + hint if hint else line


def _condense(message: str, parser: Any = None, config: Any = None) -> str:
    keys: list[str] = []
    class_path = None
    leaves: list[str] = []
    given: str | None = None
    for raw in message.splitlines():
        line = raw.strip()
        if not line or _NONE_ALTERNATIVE.match(line):
            continue
        if match := _KEY.match(line):
            keys.append(match.group(1))
            line = match.group(2)
        elif match := _CLASS.match(line):
            class_path = match.group(1)
            line = match.group(2)
        elif match := _GIVEN.match(line):
            given = given or match.group(1)
            continue
        if line and not line.startswith(_STRUCTURE):
            leaves.append(_pretty(line.lstrip("- ").strip()))
    if class_path is None and given and (match := _GIVEN_CLASS.search(given)):
        class_path = match.group(1)
    if not keys and class_path and config is not None:
        keys = [k for k in [_key_of_class(config, class_path)] if k]
    text = "; ".join(dict.fromkeys(leaves)) or message.strip().splitlines()[0]
    if given and text.startswith("expected") and "Got value" not in text and len(given) <= 80:
        text += f", got {given}"
    text = text.replace(". Got value: ", ", got ")
    if match := _NOT_ACCEPTED.search(text):
        option = match.group(1)
        keys.append(option)
        text = "not an option" + (f" of {class_path}" if class_path else "")
        text += _suggest(option, _parameters(class_path) if class_path else [])
    elif own := next((m.group(1) for leaf in leaves if (m := _OWN_TYPE.match(leaf))), None):
        text = own  # the other alternatives' errors ("expected a list") are noise next to it
    elif class_path and text.startswith("expected"):  # a type error: name the class it is checked against
        text += f" ({class_path})"
    if text.startswith("unrecognized arguments:") and class_path:  # inside a class_path value
        given = next((a for a in text.split()[2:] if a.startswith("--")), "--").split("=")[0][2:]
        keys.append(given)
        text = f"not an option of {class_path}" + _suggest(given, _nested_parameters(class_path))
    if match := _GROUP_OPTION.search(text):
        kind, group, option = match.groups()
        if kind == "Subcommand":  # a whole key under the subcommand: 'model.advantag'
            group, _, option = option.rpartition(".")
        where = f"{group}.{option}" if group else option
        if kind == "Group" and class_path and (nested := _dataclass_option(class_path, group)) is not None:
            nested_path, fields = nested  # a dataclass option of the class (rollout.sampling of RolloutCallback)
            return f"{'.'.join([*keys, where])}: not an option of {nested_path}" + _suggest(option, fields)
        return f"{where}: not an option of '{group or kind.lower()}'" + _suggest(option, _group_options(parser, group))
    if text.startswith("unrecognized arguments:") and parser is not None:
        given = next((a for a in text.split()[2:] if a.startswith("--")), "").split("=")[0]
        # jsonargparse / argparse internals (third-party)
        text += _suggest(given, list(getattr(parser, "_option_string_actions", {})))
    key = ".".join(keys)
    return f"{key}: {text}" if key and not text.startswith(key) else text


def _dataclass_option(class_path: str, name: str) -> tuple[str, list[str]] | None:
    """(the public class path, the fields) of ``class_path``'s parameter ``name`` when its default is a dataclass."""
    module_name, _, cls_name = class_path.rpartition(".")
    try:
        param = inspect.signature(getattr(importlib.import_module(module_name), cls_name)).parameters.get(name)
    except Exception:  # noqa: BLE001 - the plain group message is used instead
        return None
    if param is None or not dataclasses.is_dataclass(param.default):
        return None
    cls = type(param.default)
    package = importlib.import_module("lightning_grpo")
    public = cls.__name__ in package.__all__ and getattr(package, cls.__name__) is cls
    path = f"lightning_grpo.{cls.__name__}" if public else f"{cls.__module__}.{cls.__qualname__}"
    return path, [f.name for f in dataclasses.fields(cls)]


def _group_options(parser: Any, group: str) -> list[str]:
    """The option names directly under ``group`` in ``parser`` (and its subcommand parsers)."""
    parsers = [parser] if parser is not None else []
    sub = getattr(parser, "_subcommands_action", None)  # jsonargparse / argparse internals (third-party)
    if sub is not None:
        # jsonargparse / argparse internals (third-party)
        parsers += list(getattr(sub, "_name_parser_map", {}).values())
    names = set()
    for p in parsers:
        for action in getattr(p, "_actions", []):  # jsonargparse / argparse internals (third-party)
            dest = getattr(action, "dest", "")  # jsonargparse / argparse internals (third-party)
            if dest.startswith(group + ".") and "." not in dest[len(group) + 1 :]:
                names.add(dest[len(group) + 1 :])
    return sorted(names)


def _key_of_class(config: Any, class_path: str) -> str | None:
    """The dotted key whose value has ``class_path`` (the first found) in a parsed config."""
    # a jsonargparse Namespace or a dict (third-party)
    tree = config.as_dict() if hasattr(config, "as_dict") else config

    def walk(node: Any, prefix: str) -> str | None:
        if isinstance(node, dict) and node.get("class_path") == class_path:
            return prefix.rstrip(".")
        children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for name, value in children:
            found = walk(value, f"{prefix}{name}.")
            if found:
                return found
        return None

    return walk(tree, "")


def mark(err: BaseException) -> BaseException:
    """Mark ``err`` as a configuration error (printed as its message alone by the console script)."""
    setattr(err, _MARK, True)
    return err


def is_marked(err: BaseException) -> bool:
    return bool(getattr(err, _MARK, False))  # any exception (a library's too): the mark is an attribute set by mark()


def print_and_exit(message: str, prog: str = "lightning-grpo", status: int = 2) -> NoReturn:
    """Write ``prog: error: message`` as the last line of the output and exit with ``status``."""
    sys.stdout.flush()
    sys.stderr.write(f"{prog}: error: {message}\n")
    sys.stderr.flush()
    raise SystemExit(status)
