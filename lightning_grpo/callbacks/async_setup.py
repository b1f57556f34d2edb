"""Setup for server and asynchronous rollouts: config checks (staleness, the loss's off-policy correction)
and a checkpoint written before a run stops because no vLLM server answers any more."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import lightning as L

from ..rollout.engine_settings import EngineSettings
from ..rollout.server_engine import NoServerLeftError
from .distributed import local_log_dir


def check_async_config(engine: EngineSettings, max_staleness: int) -> None:
    """One clear error for a bad ``max_staleness`` before any work."""
    if not isinstance(max_staleness, int) or max_staleness < 0:
        raise ValueError(f"rollout.max_staleness must be an integer >= 0 (0 = synchronous), got {max_staleness!r}")
    if max_staleness > 0 and not engine.async_capable:
        raise ValueError(
            f"rollout.max_staleness={max_staleness} (asynchronous rollouts) needs an engine that samples on other "
            f"processes (engine: vllm_server), got {engine.name!r}"
        )


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
