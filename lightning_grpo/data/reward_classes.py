"""Rewards named by a class: built once, with the spec's ``kwargs`` as constructor options.

``reward_model`` and ``llm_judge`` are such classes, and so can a user's reward be
(``name: my_pkg.rewards:MyReward``): anything that needs state across batches (a loaded model, a
connection pool, counters). The instance, called as ``instance(completions, **columns)``, scores
every batch; an optional ``totals() -> {key: number}`` is logged as ``reward/<name>/<key>``
(:meth:`~lightning_grpo.data.reward_set.RewardSet.totals`).
"""

from __future__ import annotations

import inspect
from dataclasses import replace

from lightning_grpo.data.reward_spec import RewardSpec
from lightning_grpo.data.rewards import resolve_reward

_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def instantiate_reward_class(spec: RewardSpec) -> RewardSpec:
    """The spec with its class built (``RewardSet`` calls this for every spec); other specs unchanged.

    The returned spec holds the instance as ``name``, no ``kwargs`` and the original log name as
    ``alias``. A rejected option raises one ``ValueError`` naming the reward and the option.
    """
    cls = spec.name if callable(spec.name) else resolve_reward(spec.name)
    if not isinstance(cls, type):
        return spec
    label = spec.label
    params = inspect.signature(cls).parameters.values()
    named = {p.name for p in params if p.kind in _KEYWORD}
    required = sorted(p.name for p in params if p.name in named and p.default is inspect.Parameter.empty)
    unknown = sorted(set(spec.kwargs) - named)
    if unknown:
        raise ValueError(f"reward {label!r}: unknown kwargs {unknown}; its options are {sorted(named)}")
    missing = [name for name in required if name not in spec.kwargs]
    if missing:
        raise ValueError(f"reward {label!r} needs kwargs {missing}")
    try:
        instance = cls(**spec.kwargs)
    except (ValueError, TypeError) as err:
        raise ValueError(f"reward {label!r}: {err}") from err
    return replace(spec, name=instance, kwargs={}, alias=label)
