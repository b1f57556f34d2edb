"""Setup for server and asynchronous rollouts: config checks, the default off-policy correction,
and a checkpoint written before a run stops because no vLLM server answers any more."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from ..core import CORRECTIONS
from .distributed import local_log_dir
from ..rollout.server_engine import NoServerLeftError


def check_async_config(engine: str, max_staleness: int, async_correction: str | None) -> None:
    """One clear error for a bad ``max_staleness`` / ``async_correction`` before any work."""
    if not isinstance(max_staleness, int) or max_staleness < 0:
        raise ValueError(f"rollout.max_staleness must be an integer >= 0 (0 = synchronous), got {max_staleness!r}")
    if max_staleness > 0 and engine != "vllm_server":
        raise ValueError(
            f"rollout.max_staleness={max_staleness} (asynchronous rollouts) needs engine: vllm_server, got {engine!r}"
        )
    if async_correction is not None and async_correction not in CORRECTIONS:
        raise ValueError(
            f"rollout.async_correction {async_correction!r} is not a correction; expected one of "
            f"{sorted(CORRECTIONS.names())} or null"
        )


def install_async_correction(module: L.LightningModule, name: str | None) -> None:
    """Asynchronous batches are sampled by older weights: unless the loss already corrects for the
    behaviour policy (``off_policy.correction`` or ``off_policy.sequence_mask_delta``), use ``name`` (e.g. ``tis_token``)."""
    loss = getattr(module, "loss_fn", None)
    if name is None or loss is None or loss.needs_rollout_logprobs:
        return
    loss.set_correction(name)
    rank_zero_info(f"RolloutCallback: asynchronous rollouts, off-policy correction {name!r} on (async_correction)")


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
            trainer.save_checkpoint(path)
        except Exception as save_err:  # still report the outage
            raise NoServerLeftError(f"{err}; writing a checkpoint to {path} failed too: {save_err}") from err
        raise NoServerLeftError(f"{err}; training stopped at step {trainer.global_step}, checkpoint written to {path}") from err
