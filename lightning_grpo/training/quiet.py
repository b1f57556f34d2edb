"""Lightning's messages about objects of ours that every GRPO run would print, filtered by their text (anything
else Lightning says still shows). A Python program that uses the module gets the same quiet console as the
command line (which filters more: :mod:`lightning_grpo.cli.quiet`).

- :data:`LIGHTNING_TIPS`, at import: Lightning's advertisements for its hosted logger and model registry, printed
  when a Trainer is made and at every fit (before any hook of ours runs, hence at import of the module);
- :data:`RUN_WARNINGS`, from ``GRPOModule.setup`` on: warnings Lightning gives about what the module hands it.
"""

from __future__ import annotations

import logging
import warnings

#: Message prefixes of Lightning's advertisements (``lightning.pytorch.utilities.rank_zero`` log records).
LIGHTNING_TIPS = ("💡 Tip: For seamless cloud",)

#: Python warnings (regular expressions matched at the message's start), each expected in a GRPO run: Lightning's
#: own use of a deprecated torch pytree API; the training ticks' ``__len__`` (``GenerationTicks`` holds no data:
#: its length is exact with any number of workers); a run without a dev split, whose validation loader is an
#: empty list (no validation runs).
RUN_WARNINGS = (
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    r"Your `IterableDataset` has `__len__` defined",
    r"Total length of `list` across ranks is zero",
)


def _not_a_tip(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith(LIGHTNING_TIPS)


def quiet_lightning_tips() -> None:
    """Filter :data:`LIGHTNING_TIPS` (idempotent)."""
    log = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if _not_a_tip not in log.filters:
        log.addFilter(_not_a_tip)


def quiet_run_warnings() -> None:
    """Filter :data:`RUN_WARNINGS` for the rest of the process (``warnings.filterwarnings`` puts each at the
    front of the filters once: calling it again adds nothing)."""
    for message in RUN_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
