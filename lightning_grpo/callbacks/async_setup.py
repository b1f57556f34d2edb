"""Setup for server and asynchronous rollouts: config checks (staleness, the loss's off-policy correction,
engine sections) and a checkpoint written before a run stops because no vLLM server answers any more."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import fields
from typing import Any

import lightning as L

from ..rollout.server_engine import NoServerLeftError
from ..rollout.vllm_args import VLLMArgs
from ..rollout.vllm_server import ServerSettings
from .distributed import local_log_dir


def check_async_config(engine: str, max_staleness: int) -> None:
    """One clear error for a bad ``max_staleness`` before any work."""
    if not isinstance(max_staleness, int) or max_staleness < 0:
        raise ValueError(f"rollout.max_staleness must be an integer >= 0 (0 = synchronous), got {max_staleness!r}")
    if max_staleness > 0 and engine != "vllm_server":
        raise ValueError(
            f"rollout.max_staleness={max_staleness} (asynchronous rollouts) needs engine: vllm_server, got {engine!r}"
        )


def unused_engine_sections(engine: str, vllm: VLLMArgs, server: ServerSettings) -> list[str]:
    """One line per section set for an engine the run does not use (a recipe switched to ``--rollout.engine hf``
    keeps its ``vllm`` section: said, not refused)."""
    lines = []
    for key, owner, settings in (("vllm", "vllm", vllm), ("server", "vllm_server", server)):
        changed = _changed_fields(settings, type(settings)())
        if engine != owner and changed:
            values = ", ".join(f"{name}={value!r}" for name, value in changed)
            lines.append(f"rollout.{key} is set ({values}) but not used: rollout.engine is {engine!r}")
    return lines


def _changed_fields(settings: Any, default: Any) -> list[tuple[str, Any]]:
    values = [(f.name, getattr(settings, f.name), getattr(default, f.name)) for f in fields(settings)]
    return [(name, value) for name, value, default_value in values if value != default_value]


@contextlib.contextmanager
def checkpoint_on_server_failure(trainer: L.Trainer) -> Iterator[None]:
    """When every vLLM server is gone, save a checkpoint and stop with an error naming the URLs and it."""
    try:
        yield
    except NoServerLeftError as err:
        # not trainer.log_dir (a broadcast): this rank may be the only one that lost its servers
        directory = os.path.join(local_log_dir(trainer) or trainer.default_root_dir, "checkpoints")
        path = os.path.join(directory, f"server-failure-step{trainer.global_step}.ckpt")
        try:
            trainer.save_checkpoint(path, weights_only=False)
        except Exception as save_err:  # noqa: BLE001 - whatever the save raised, the outage is still reported
            raise NoServerLeftError(f"{err}; writing a checkpoint to {path} failed too: {save_err}") from err
        raise NoServerLeftError(
            f"{err}; training stopped at step {trainer.global_step}, checkpoint written to {path}"
        ) from err
