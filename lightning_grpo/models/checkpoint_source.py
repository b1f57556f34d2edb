"""``model.model`` naming a checkpoint: a run's ``.ckpt`` file, its version folder or its run folder (an SFT
run before GRPO, or a GRPO run to start afresh from). Such a source is exported once
(:func:`lightning_grpo.models.export.export`: LoRA merged, a QLoRA base dequantised) into the model folder
``<checkpoint stem>_model/`` next to the checkpoint, and that folder is the policy's source, as if it had
been exported by hand with ``lightning-grpo export``; it is exported again when the checkpoint is newer.
A lock file keeps the ranks of one machine from exporting at once. Model folders, hub ids and anything
else pass unchanged."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .checkpoints import ExportError, find_checkpoint, is_distributed_checkpoint


def is_checkpoint_source(path: Path) -> bool:
    """A file, or a folder that is no model folder (no config.json) but a run, version or distributed checkpoint folder."""
    if path.is_file():
        return True
    if not path.is_dir() or (path / "config.json").is_file():
        return False
    return (path / "checkpoints").is_dir() or any(path.glob("version_*")) or is_distributed_checkpoint(path)


def model_folder_of(source: str | None) -> str | None:
    """``source``, or the model folder exported from the checkpoint it names (see the module docstring)."""
    if not isinstance(source, str) or not is_checkpoint_source(Path(source).expanduser()):
        return source
    try:
        checkpoint = find_checkpoint(Path(source).expanduser())
        out = checkpoint.with_name(f"{checkpoint.stem}_model")
        with _locked(checkpoint.with_name(f".{checkpoint.stem}_model.lock")):
            if not (out / "config.json").is_file() or out.stat().st_mtime < checkpoint.stat().st_mtime:
                from .export import export

                export(checkpoint, out, force=True)
    except ExportError as err:
        raise ValueError(f"model.model: {err}") from None
    return str(out)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
