"""The default guard set: what :meth:`GRPOModule.configure_callbacks <lightning_grpo.GRPOModule.configure_callbacks>`
attaches when the Trainer names no guard (docs/guide/stability.md).

Each guard logs ``alarm/<name>`` and acts (warn / skip the step / stop):

- :class:`~.guards.NonFiniteGuard`: NaN / inf loss or gradient: skip the step, stop after 3 in a row;
- :class:`~.guards.LogProbGuard`: NaN log-probs on valid tokens: stop with a diagnosis;
- :class:`~.guards.EntropyGuard` (``floor=0.05, max_reward=0.9``): entropy collapse while the reward is still low;
- :class:`~.signal_guards.IdenticalSamplesGuard`: a group's samples repeat at T > 0 (seeding);
- :class:`~.signal_guards.MismatchGuard`: engine vs trainer log-probs drift (k3 > 0.01);
- :class:`~.zero_reward.ZeroRewardGuard`: every reward was 0 in the run's first 10 generation batches (warns once,
  naming the likeliest causes: the answer's type, the reward function or its column, the answer's format, truncation);
- :class:`~.signal_guards.ZeroStdGuard` (``max_reward=0.9``): >= 75% of groups carry no signal, unless the task
  is learned (all-right groups);
- :class:`~.signal_guards.TruncationGuard` (``max_reward=0.9``): > 50% of completions cut off by
  ``max_new_tokens``, all at one reward, 10 batches in a row (the budget is too small for the task).

Name any guard in ``trainer.callbacks`` to choose your own set instead (then none of these is added), or set
``model.default_guards: false`` for none.
"""

from __future__ import annotations

from .guards import EntropyGuard, Guard, LogProbGuard, NonFiniteGuard
from .signal_guards import IdenticalSamplesGuard, MismatchGuard, TruncationGuard, ZeroStdGuard
from .zero_reward import ZeroRewardGuard

__all__ = ["default_guards"]


def default_guards() -> list[Guard]:
    """A fresh instance of each default guard, in the order they run."""
    return [
        NonFiniteGuard(),
        LogProbGuard(),
        EntropyGuard(floor=0.05, max_reward=0.9),
        IdenticalSamplesGuard(),
        MismatchGuard(),
        ZeroRewardGuard(),
        ZeroStdGuard(max_reward=0.9),
        TruncationGuard(max_reward=0.9),
    ]
