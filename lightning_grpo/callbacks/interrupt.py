"""Ctrl-C during a fit: save the run where it stands and say how to resume it.

:class:`InterruptCheckpoint` (``lightning-grpo fit`` attaches it; add it to your own Trainer's callbacks
if you want it) saves ``last.ckpt`` at the step the run was interrupted at, in the run's
``ModelCheckpoint`` folder (``<run>/version_N/checkpoints`` by default), and prints one line::

    lightning-grpo: interrupted at step 37: saved runs/quickstart/version_0/checkpoints/last.ckpt; resume with:
    lightning-grpo fit -c runs/quickstart/version_0/config.yaml --ckpt_path last

The resume is exact: which prompts a step samples is a function of the seed and the step
(:mod:`lightning_grpo.data.datamodule`), and the checkpoint holds the optimizer step reached, so the
resumed run redoes the interrupted step as the uninterrupted run would have. Multi-process runs are
left to their periodic checkpoints (a save is a collective, and a Ctrl-C may reach the ranks apart).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from .distributed import local_log_dir

#: The file the interrupted run is saved to (what ``--ckpt_path last`` resumes).
LAST = "last.ckpt"


class InterruptCheckpoint(Callback):
    """On a KeyboardInterrupt during ``fit`` (one process): save ``last.ckpt`` at the current step and print
    the command that resumes it (see the module docstring). ``command``: the command line's fit command
    (``lightning-grpo sft fit`` for a supervised run)."""

    def __init__(self, command: str = "lightning-grpo fit") -> None:
        self.command = command
        self._interrupted = False

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if not isinstance(exception, KeyboardInterrupt) or trainer.world_size > 1 or trainer.state.fn != "fit":
            return
        path = checkpoint_folder(trainer) / LAST
        if path.is_symlink():  # ModelCheckpoint(save_last="link"): keep the step checkpoint it points to
            path.unlink()
        self._interrupted = True
        try:
            trainer.save_checkpoint(path, weights_only=False)
        finally:
            self._interrupted = False
        print(
            f"lightning-grpo: interrupted at step {trainer.global_step}: saved {path}; resume with: "
            f"{resume_command(trainer, path, self.command)}",
            file=sys.stderr,
            flush=True,
        )

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        """The interrupt's save: the step it cut short is recorded as not begun (see :func:`unbegin_batch`)."""
        if self._interrupted:
            unbegin_batch(checkpoint)


def unbegin_batch(checkpoint: dict[str, Any]) -> None:
    """A batch that was begun but not processed when the run was interrupted is recorded as not begun, as a
    save between two steps records it: Lightning would otherwise take the save for one made at the batch's
    end and count the batch as stepped (the resumed run's metrics one step late)."""
    progress = checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]
    for counters in (progress["total"], progress["current"]):
        if counters["processed"] < counters["ready"]:
            counters["ready"] = counters["started"] = counters["processed"] = counters["completed"]


def checkpoint_folder(trainer: Any) -> Path:
    """The run's ModelCheckpoint folder, else ``<log dir>/checkpoints`` (where ``--ckpt_path last`` looks)."""
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.dirpath:
            return Path(callback.dirpath)
    return Path(local_log_dir(trainer) or trainer.default_root_dir) / "checkpoints"


def resume_command(trainer: Any, path: Path, command: str = "lightning-grpo fit") -> str:
    """``<command> -c <the run's saved config.yaml> --ckpt_path last`` for a command-line run (one that saved
    its config), else the ``Trainer.fit`` argument that resumes ``path``."""
    config = Path(local_log_dir(trainer) or trainer.default_root_dir) / "config.yaml"
    if config.is_file():
        return f"{command} -c {config} --ckpt_path last"
    return f"trainer.fit(..., ckpt_path={str(path)!r})"
