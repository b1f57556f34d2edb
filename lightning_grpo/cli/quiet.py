"""What the command line keeps off its first screen: library messages that are expected in our use.

Each is named by its text, so anything else a library says still shows. Python programs that use
the module and the callback directly keep their own warning settings; the in-process vLLM engine
filters its known lines itself (:data:`~lightning_grpo.rollout.vllm_env.KNOWN_HARMLESS`)."""

from __future__ import annotations

import logging
import warnings
from typing import Any

from ..rollout.vllm_env import KNOWN_HARMLESS, prefix_filter, skip_known_harmless

#: Python warnings, by message (a regular expression matched at the start): Lightning's own use of
#: a deprecated torch pytree API; our prompt dataset's ``__len__`` (one worker: exact); vLLM's
#: Triton dispatcher touching ``torch.distributed.reduce_op`` on import.
EXPECTED_WARNINGS = (
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    r"Your `IterableDataset` has `__len__` defined",
    r"`torch.distributed.reduce_op` is deprecated",
)

#: Lightning's advertisement for its hosted logger, printed at every fit.
EXPECTED_LOGS = {"lightning.pytorch.utilities.rank_zero": ("💡 Tip: For seamless cloud logging",)}


_skip_expected = prefix_filter(EXPECTED_LOGS)


def quiet_expected_messages() -> None:
    """Silence :data:`EXPECTED_WARNINGS`, :data:`EXPECTED_LOGS` and the engine's known lines for the
    rest of the process (the command line calls it once, before parsing)."""
    for message in EXPECTED_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    for name in EXPECTED_LOGS:
        logging.getLogger(name).addFilter(_skip_expected)
    for name in KNOWN_HARMLESS:
        logging.getLogger(name).addFilter(skip_known_harmless)


#: Lightning's warning when a checkpoint is loaded into a run whose checkpoint folder is another (``test``,
#: ``validate`` and a resume log into a new version folder): it says the ranked checkpoints' scores are not
#: reloaded, which matters only to a resumed ``fit`` that keeps ranked checkpoints (``save_top_k`` above 0).
DIRPATH_CHANGED = r"The dirpath has changed from"


def quiet_dirpath_change(subcommand: str, trainer: Any) -> None:
    """Filter :data:`DIRPATH_CHANGED` unless ``subcommand`` is a ``fit`` that keeps ranked checkpoints."""
    if subcommand != "fit" or not keeps_ranked_checkpoints(trainer):
        warnings.filterwarnings("ignore", message=DIRPATH_CHANGED)


def keeps_ranked_checkpoints(trainer: Any) -> bool:
    """Whether any ModelCheckpoint of ``trainer`` ranks checkpoints (``save_top_k`` other than 0: the recipes
    keep ``last.ckpt`` only)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    return any(c.save_top_k != 0 for c in trainer.callbacks if isinstance(c, ModelCheckpoint))
