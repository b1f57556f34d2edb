"""What the command line does when a run fails after it started.

The run folder gets ``failed.txt``: the error in one line, then its full traceback
(``lightning-grpo report`` shows the first line). An error whose message names its cause and fix (a
reward function that raised on a sample: :class:`~lightning_grpo.data.registry.RewardError`; a weight
push that did not land: :class:`~lightning_grpo.callbacks.push_check.WeightPushError`) is
printed as that one line, with where the traceback is, and the command exits with status 1; set
``LIGHTNING_GRPO_DEBUG=1`` to get the traceback on the console instead. Any other error keeps its
traceback (it may be a bug)."""

from __future__ import annotations

import os
import traceback
from pathlib import Path

#: The environment variable that prints a failed run's traceback instead of its one line.
DEBUG_ENV = "LIGHTNING_GRPO_DEBUG"
#: The file a failed run leaves in its run folder.
FAILED_FILE = "failed.txt"


def explained_errors() -> tuple[type[BaseException], ...]:
    """The errors whose message names their cause and fix: printed as one line, without a traceback (imported
    when a run fails: ``report`` reads this module without torch)."""
    from ..callbacks.push_check import WeightPushError
    from ..data.registry import RewardError

    return (RewardError, WeightPushError)


class RunFailed(Exception):
    """A run stopped by an error its message explains (printed as one line, exit status 1)."""


def debug_mode() -> bool:
    """Whether ``LIGHTNING_GRPO_DEBUG`` asks for full tracebacks (set, and not ``0`` / ``false``)."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def first_line(err: BaseException) -> str:
    """``err``'s message on one line (its type when the message is empty)."""
    text = " ".join(str(err).split())
    return text or type(err).__name__


def record_failure(run_dir: str | Path | None, err: BaseException, step: int) -> Path | None:
    """Write ``failed.txt`` into ``run_dir`` (when that folder exists): the error's line, the step it
    stopped at and the traceback. Returns the file written, or None."""
    if run_dir is None or not Path(run_dir).is_dir():
        return None
    path = Path(run_dir) / FAILED_FILE
    trace = "".join(traceback.format_exception(err))
    path.write_text(
        f"failed at step {step}: {type(err).__name__}: {first_line(err)}\n\n{trace}",
        encoding="utf-8",
    )
    return path


def explained(err: BaseException, written: Path | None) -> RunFailed | None:
    """The one-line :class:`RunFailed` for an error that names its cause (None for any other error,
    and in debug mode)."""
    if debug_mode() or not isinstance(err, explained_errors()):
        return None
    where = f"the traceback is in {written}" if written is not None else "the run folder was not written"
    return RunFailed(f"{first_line(err)} (the run stopped; {where}; {DEBUG_ENV}=1 prints it)")


def failed_line(run_dir: Path) -> str | None:
    """The first line of ``run_dir``'s ``failed.txt`` (None when the run did not fail)."""
    path = run_dir / FAILED_FILE
    if not path.is_file():
        return None
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return lines[0] if lines else "failed"
