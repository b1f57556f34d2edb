"""A callback that breaks one rank of a DDP run on purpose (tests/e2e/test_ranks.py adds it to a
``lightning-grpo fit`` with ``--trainer.callbacks+=``). Every rank records its pid in
``marker_dir/rank<r>.pid`` when it reaches training step ``step``; then rank ``rank`` fails:

``raise``: raises RuntimeError; ``exit``: ``os._exit(3)`` (a crash: no Python cleanup);
``hang``: sleeps for an hour (a rank that stops answering); ``none``: nothing (the marker only).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from lightning.pytorch.callbacks import Callback

from lightning_grpo.callbacks.guards import Guard


class RankFault(Callback):
    def __init__(self, marker_dir: str, rank: int = 1, step: int = 1, kind: str = "none") -> None:
        self.marker_dir, self.rank, self.step, self.kind = Path(marker_dir), rank, step, kind

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step != self.step:
            return
        self.marker_dir.mkdir(parents=True, exist_ok=True)
        (self.marker_dir / f"rank{trainer.global_rank}.pid").write_text(str(os.getpid()))
        if trainer.global_rank != self.rank:
            return
        if self.kind == "raise":
            raise RuntimeError(f"injected fault on rank {self.rank}")
        if self.kind == "exit":
            os._exit(3)
        if self.kind == "hang":
            time.sleep(3600)


class RankZeroGuard(Guard):
    """A guard that fires (warn) on rank 0 alone at step ``step``: its alarm and the completions
    of that step are written while rank 1 trains on."""

    name = "rank_zero_only"

    def __init__(self, step: int = 1) -> None:
        super().__init__("warn")
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_rank == 0 and trainer.global_step == self.step:
            self.fire(trainer, pl_module, "fired on rank 0 alone")
