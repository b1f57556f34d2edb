"""The callbacks a :class:`~lightning_grpo.training.module.GRPOModule` brings to its Trainer.

``GRPOModule.configure_callbacks`` (Lightning's hook for them) returns what every entry of `MODULE_CALLBACKS`
gives, in the order of their names. :mod:`lightning_grpo.callbacks` registers its entries when it is imported
(the default guards, the step progress bar, the one-line model summary), so this folder needs no import of the
callbacks above it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.registry import Registry

#: ``name -> factory(trainer, module) -> list of callbacks``: what a module adds to its Trainer's callbacks.
MODULE_CALLBACKS: Registry[Callable[[Any, Any], list]] = Registry("module callback")
