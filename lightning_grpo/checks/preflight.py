"""Pre-flight: what a run depends on outside itself, checked before any engine starts.

:func:`check_external` (run by :meth:`~lightning_grpo.plan.run_plan.RunPlan.resolve`) opens a TCP
connection to every server the run will talk to and looks for every folder it will load from, so
that an unreachable server or a missing folder is one line at start-up (the URL or the path, and
what to do) rather than a failure after the engine started:

* ``rollout.engine.init_args.urls`` (`ServerSettings` with servers you run);
* ``rollout.agent.environment_args.base_url`` (or any ``*_url`` there: an OpenEnv server, ...);
* reward objects with a ``url`` / ``base_url`` (``llm_judge``, a reward-model server of your own);
* distillation teachers given as folders (``model.distillation.teacher``): a missing folder names
  the command that makes it, read from the recipe's header when it has one (as
  ``recipes/distill_quickstart.yaml``'s does);
* a policy given as a hub id (:func:`hub_model_problem`, run by
  :func:`~lightning_grpo.checks.model_checks.check_model_source`): in the local Hugging Face cache, or
  on a hub that answers within seconds (offline: ``HF_HUB_OFFLINE`` set, or no connection).

A TCP connection only says that something listens: a server that answers badly still fails later,
with its own error. Each connection waits at most :data:`CONNECT_TIMEOUT_S` seconds.
"""

from __future__ import annotations

import os
import re
import socket
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..data.reward_set import RewardSet
    from ..rollout.base import RolloutEngine
    from ..rollout.engine_settings import EngineSettings

#: Seconds one connection attempt may take (a refused connection answers at once).
CONNECT_TIMEOUT_S = 3.0
_DEFAULT_PORTS = {"http": 80, "ws": 80, "https": 443, "wss": 443}


def check_external(module: Any, urls: Iterable[tuple[str, str, str]], recipes: Sequence[str | Path] = ()) -> None:
    """Raise on the first server that cannot be reached or teacher folder that is missing.

    ``urls``: (option, URL, what to do when it is down) of every server the rollout talks to (`servers`);
    ``recipes``: the run's config files (the CLI's ``-c``), searched for the command that makes a
    missing teacher folder."""
    for field, url, remedy in urls:
        problem = unreachable(url)
        if problem:
            raise ConnectionError(f"{field}: {url} {problem}: {remedy}")
    check_teachers(module, recipes)


# ------------------------------------------------------------------------------------ servers
def servers(
    engine_settings: EngineSettings,
    engine: RolloutEngine | None,
    reward_set: RewardSet,
    environment_args: Mapping[str, Any],
) -> Iterator[tuple[str, str, str]]:
    """(field, URL, what to do when it is down) of every server the run's rollout talks to: the engine's (unless
    ``engine`` was handed over), the environment's (``environment_args``' ``url`` / ``*_url``) and the rewards'."""
    for url in engine_settings.server_urls() if engine is None else []:
        yield (
            "rollout.engine.init_args.urls",
            str(url),
            "start the vLLM server first (docs/guide/scaling.md), or drop rollout.engine.init_args.urls to have the "
            "run start its own",
        )
    for key, value in environment_args.items():
        if key == "url" or key.endswith("_url"):
            yield (
                f"rollout.agent.environment_args.{key}",
                str(value),
                "start the environment's server first (docs/guide/environments.md) and check the port",
            )
    for i, (spec, fn) in enumerate(zip(reward_set.specs, reward_set.fns)):
        url = getattr(fn, "base_url", None) or getattr(fn, "url", None)
        if isinstance(url, str) and url.startswith(("http://", "https://")):
            yield (
                f"rollout.rewards[{i}] ({spec.label})",
                url,
                "start the reward's server first (docs/guide/reward-models.md) and check its base_url",
            )


def unreachable(url: str, timeout_s: float = CONNECT_TIMEOUT_S) -> str | None:
    """Why no TCP connection opens to ``url``'s host and port, or None when one does."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        return "has a port that is not a number"
    if not parts.hostname or port is None:
        return "names no host (expected scheme://host:port)"
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout_s):
            return None
    except socket.gaierror:
        return f"is unknown: the host name {parts.hostname!r} does not resolve"
    except ConnectionRefusedError:
        return "refused the connection (nothing listens there)"
    except TimeoutError:
        return f"did not answer within {timeout_s:g} s"
    except OSError as err:
        return f"cannot be reached ({err.strerror or err})"


# ------------------------------------------------------------------------------------ hub ids
#: Seconds the hub may take to say whether a model exists.
HUB_TIMEOUT_S = 10.0


def hub_offline() -> bool:
    """Whether the Hugging Face hub is switched off (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``)."""
    from huggingface_hub import constants

    flags = (os.environ.get(name, "").upper() for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return bool(constants.HF_HUB_OFFLINE) or any(flag in ("1", "ON", "YES", "TRUE") for flag in flags)


def hub_model_problem(name: str) -> str | None:
    """Why the hub id ``name`` cannot be loaded, or None when it is in the local cache or on the hub (or
    the hub's answer says nothing for sure: the loader then reports it). Takes seconds, never retries."""
    from huggingface_hub import HfApi, constants, try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError, RepositoryNotFoundError

    try:
        if isinstance(try_to_load_from_cache(name, "config.json"), str):
            return None
    except HFValidationError as err:
        return f"is not a valid hub id ({str(err).splitlines()[0]})"
    if hub_offline():
        return "is not in the local Hugging Face cache and the hub is offline (HF_HUB_OFFLINE is set)"
    problem = unreachable(constants.ENDPOINT)
    if problem:
        return f"is not in the local Hugging Face cache and the hub ({constants.ENDPOINT}) {problem}"
    try:
        HfApi().model_info(name, timeout=HUB_TIMEOUT_S)
    except RepositoryNotFoundError:
        return (
            f"was not found on the hub ({constants.ENDPOINT}): a typo, or a private model (log in with `hf auth login`)"
        )
    except Exception:  # noqa: BLE001 - a slow or odd answer: the loader says what is wrong
        return None
    return None


# ----------------------------------------------------------------------------------- teachers
def check_teachers(module: Any, recipes: Sequence[str | Path] = ()) -> None:
    """Every teacher given as a folder (or ``adapter:<folder>``) exists."""
    distiller = module.distiller
    if distiller is None:
        return
    named = distiller.settings.named_teachers
    for name, spec in named.items():
        if not isinstance(spec, str) or spec == "base" or spec.startswith("tiny:"):
            continue
        where = "model.distillation.teacher" + (f"[{name!r}]" if len(named) > 1 else "")
        folder = spec.split(":", 1)[1] if spec.startswith("adapter:") else spec
        if Path(folder).expanduser().is_dir():
            continue
        command = making_command(folder, recipes)
        if command is None and not _looks_local(folder):
            continue  # a hub name 'org/name'
        what = "an adapter folder" if spec.startswith("adapter:") else "a model folder"
        todo = (
            f"make it first: {command}"
            if command
            else (
                "make it first, e.g. train a teacher with --trainer.callbacks+=lightning_grpo.SavePretrained "
                f"--trainer.callbacks.dirpath={folder}, or give a hub name 'org/name'"
            )
        )
        raise FileNotFoundError(f"{where}: {folder} does not exist (expected {what}); {todo}")


def _looks_local(source: str) -> bool:
    """A path rather than a hub name ``org/name`` (the rule ``Distiller`` loads teachers by)."""
    parts = Path(source).parts
    return source.startswith((".", "/", "~")) or source.count("/") != 1 or (bool(parts) and Path(parts[0]).is_dir())


def making_command(folder: str, recipes: Sequence[str | Path]) -> str | None:
    """The ``lightning-grpo ...`` command in a recipe's header comments that writes ``folder``
    (continuation lines joined), or None."""
    for recipe in recipes:
        try:
            lines = Path(recipe).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        header = []
        for line in lines:
            if not line.startswith("#"):
                break
            header.append(line.lstrip("#").strip())
        text = re.sub(r"\s*\\\s*\n\s*", " ", "\n".join(header))  # join "\"-continued lines
        for line in text.splitlines():
            if line.startswith("lightning-grpo ") and re.search(rf"=\s*{re.escape(folder.rstrip('/'))}/?(\s|$)", line):
                return line
    return None
