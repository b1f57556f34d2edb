"""A callback that presses Ctrl-C once: a KeyboardInterrupt at the start of a given training step."""

from __future__ import annotations

import lightning as L


class CtrlC(L.Callback):
    """Raises KeyboardInterrupt at the start of step ``step``, once per test process (``pressed``: reset it
    at the start of a test); the resumed run, which lists it too, goes on."""

    pressed = False

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step and not CtrlC.pressed:
            CtrlC.pressed = True
            raise KeyboardInterrupt
