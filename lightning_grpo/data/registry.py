"""The reward registry (:data:`REWARDS`) and what a reward function is, apart from any reward.

The reward modules (:mod:`.rewards`, :mod:`.judge`, :mod:`.reward_models`, :mod:`.reasoning_gym`)
import this module and register into it; :mod:`.rewards` imports the others, so importing it (or
anything that uses rewards) fills the registry. Nothing here imports a reward module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from lightning_grpo.core.registry import Registry
from lightning_grpo.core.resolve import resolve_callable

__all__ = ["REWARDS", "RewardError", "RewardFn", "RewardTimeoutError", "resolve_reward", "validated_by"]

RewardFn = Callable[..., Sequence[float]]

REWARDS: Registry = Registry("reward function")


class RewardError(RuntimeError):
    """A reward function failed or returned something that is not one finite number per completion."""


class RewardTimeoutError(RewardError):
    """A reward function did not finish within its ``timeout_s``."""


def resolve_reward(name: str | RewardFn) -> RewardFn:
    """The reward function registered as ``name``, or imported from ``"pkg.mod.fn"`` / ``"pkg.mod:fn"``.

    A callable is returned unchanged. Raises ``ValueError`` naming the string when it is neither
    registered nor importable, and ``TypeError`` when the imported object is not callable.
    """
    return resolve_callable(name, REWARDS, "reward function", "'my_pkg.rewards.fn' or 'my_pkg.rewards:fn'")


def validated_by(check: Callable[..., None]) -> Callable[[RewardFn], RewardFn]:
    """Attach ``check`` as the function's ``validate_kwargs`` (called once by :class:`RewardSet`)."""

    def decorator(fn: RewardFn) -> RewardFn:
        fn.validate_kwargs = check  # type: ignore[attr-defined]
        return fn

    return decorator
