"""Multi-process runs that cannot hang silently.

* :func:`local_log_dir`: the run directory without ``Trainer.log_dir``'s broadcast (a collective:
  read on rank 0 alone it met another rank's all-reduce and both waited forever).
* :func:`warn_if_oversubscribed`: more CPU processes than cores, said in one line before work starts.
"""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger("lightning_grpo.distributed")


def local_log_dir(trainer: Any) -> str | None:
    """What ``trainer.log_dir`` returns, read from this process alone (no broadcast). On rank 0 it
    is the run directory; other ranks may see another version number, so only rank-0 writers use it."""
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    if not trainer.loggers:
        return trainer.default_root_dir
    logger = trainer.loggers[0]
    return logger.log_dir if isinstance(logger, (TensorBoardLogger, CSVLogger)) else logger.save_dir


def available_cpus() -> int:
    """The cores this process may run on (its affinity mask; ``os.cpu_count`` where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
