"""One explicit way for a callback to find another: by class, with ``isinstance``.

A callback that needs another (a guard that switches the rollout callback's dynamic sampling on, or
has it log the current completions) asks :func:`find_callback` for it by class, instead of sniffing
attributes on every callback of the Trainer. ``required=True`` raises one clear error naming the
class that is missing, who needs it and how to add it; ``required=False`` returns None where the
cooperation is optional.
"""

from __future__ import annotations

from typing import Any, TypeVar

C = TypeVar("C")


def find_callback(trainer: Any, cls: type[C], *, required: bool = True, needed_by: Any = None) -> C | None:
    """The first callback of ``trainer`` that is a ``cls`` (subclasses included); None when there is
    none and ``required`` is False. ``needed_by``: the callback (or a name) that asks, for the error."""
    for callback in getattr(trainer, "callbacks", None) or []:  # a Lightning Trainer or a stand-in (third-party)
        if isinstance(callback, cls):
            return callback
    if not required:
        return None
    who = needed_by if isinstance(needed_by, str) or needed_by is None else type(needed_by).__name__
    raise ValueError(
        f"{who or 'this callback'} needs a {cls.__name__} among Trainer(callbacks=...): add one there "
        f"(with the lightning-grpo CLI: trainer.callbacks, or the 'rollout:' section for the rollout callback)"
    )
