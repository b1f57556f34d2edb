"""One reward function of a reward set, as a recipe writes it (`RewardSpec`).

Apart from `.reward_set` so that `.reward_classes`, which builds a class-named reward
from its spec, and the set can both import it without importing each other.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from jsonargparse.typing import register_type

__all__ = ["RewardName", "RewardSpec", "as_reward_spec"]

#: What a reward function's name may hold: no spaces, brackets, braces or commas, so that a mistyped
#: ``{name: ...}`` entry is read (and reported) as a `RewardSpec`, not taken for a name.
_NAME = re.compile(r"[^\s\[\]{},]+")


class RewardName(str):
    """A reward function's registry name or import path alone, shorthand for ``{name: ...}``
    (``rollout.rewards: [my_rewards.fn]``, ``--rollout.rewards my_rewards.fn``)."""


def reward_name(value: Any) -> str:
    """``value`` checked as a `RewardName` (the command line's and recipes' parser reads it as a plain ``str``)."""
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a reward function's name: name one alone (my_rewards.fn) or list them "
            "([my_rewards.fn, {name: exact_match, weight: 0.5}])"
        )
    return str(value)


register_type(RewardName, serializer=str, deserializer=reward_name)


@dataclass
class RewardSpec:
    """One reward function of a `RewardSet`, as written in a recipe.

    Example:
        ```python
        from lightning_grpo import RewardSpec

        rewards = [
            RewardSpec("math_accuracy"),  # a registered name
            RewardSpec("my_pkg.rewards:format_ok", weight=0.1, timeout_s=30, on_timeout="zero"),  # an import path
            RewardSpec("regex_format", kwargs={"pattern": r"^<answer>.*</answer>$"}, alias="format"),
        ]
        ```
    """

    name: str | Callable[..., Sequence[float]]
    """Registry name (see ``REWARDS``), import path ``"pkg.module.fn"`` / ``"pkg.module:fn"``, or the
    function itself (drop-in use from Python)."""
    weight: float = 1.0
    """Weight of this reward in the weighted sum (used by the reward aggregation)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments passed on every call (e.g. ``pattern`` for ``regex_format``)."""
    timeout_s: float | None = None
    """Seconds one call (the whole batch) may take; ``None`` runs it inline without a limit."""
    on_timeout: Literal["raise", "zero"] = "raise"
    """On timeout: ``"raise"`` a `RewardTimeoutError`, or score the batch 0 and count it."""
    alias: str | None = None
    """Name in logs; defaults to ``name`` after its last ``.`` or ``:``. Must be unique in a set."""
    convention: Literal["auto", "columns", "trl"] = "auto"
    """How the function is called: ``"columns"`` ``fn(completions, **columns)``; ``"trl"`` as TRL's
    ``GRPOTrainer`` calls it, ``fn(prompts=, completions=, completion_ids=, **columns)`` (chat
    completions as message lists); ``"auto"``: ``"trl"`` for a function with a ``prompts``
    parameter or from the ``trl`` package, or for a batch whose prompts are chat messages (as TRL
    infers the format from the data; not for the package's own rewards), else ``"columns"``."""

    def __post_init__(self) -> None:
        if not isinstance(self.weight, (int, float)) or not math.isfinite(self.weight):
            raise ValueError(f"reward {self.name!r}: weight must be a finite number, got {self.weight!r}")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"reward {self.name!r}: timeout_s must be > 0 or null, got {self.timeout_s!r}")
        if self.on_timeout not in ("raise", "zero"):
            raise ValueError(f"reward {self.name!r}: on_timeout must be 'raise' or 'zero', got {self.on_timeout!r}")
        if self.convention not in ("auto", "columns", "trl"):
            raise ValueError(
                f"reward {self.name!r}: convention must be 'auto', 'columns' or 'trl', got {self.convention!r}"
            )

    @property
    def label(self) -> str:
        if self.alias:
            return self.alias
        if callable(self.name):
            return getattr(self.name, "__name__", type(self.name).__name__)  # a user's reward callable
        return re.split(r"[.:]", self.name)[-1]


def as_reward_spec(value: RewardSpec | Mapping[str, Any] | str | Callable[..., Sequence[float]]) -> RewardSpec:
    """``value`` as a `RewardSpec`: a spec as it is, a mapping as its fields, a name (`RewardName`) or a
    function as ``RewardSpec(value)``."""
    if isinstance(value, RewardSpec):
        return value
    if isinstance(value, Mapping):
        return RewardSpec(**value)
    return RewardSpec(str(value) if isinstance(value, str) else value)
