"""Reward functions called once before training, on stand-in completions of real training rows.

A reward function that raises, returns the wrong number of scores or something other than numbers
(or ``None``) would otherwise fail at the first generation batch, after the engine started.
:func:`probe_rewards` (run by :meth:`~lightning_grpo.plan.run_plan.RunPlan.resolve`) calls every
reward *function* the way the rollout will (the same columns, its convention, chat completions
for chat data) on two stand-in completions of each of the first two training rows: the row's
``answer`` and a made-up text. Reward *objects* (``llm_judge``, ``reward_model``, a class of your
own) are not called: they check their options when built, and a call costs a server request or a
model load. A function that returns ``None`` for every stand-in passes (it may not apply to them).
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Sequence
from typing import Any

from lightning_grpo.data.reward_set import RewardSet
from lightning_grpo.data.rewards import RewardError

#: The made-up second completion of each row.
STAND_IN = "a stand-in completion"


def probe_rewards(reward_set: RewardSet, records: Sequence[dict[str, Any]], tokenizer: Any, rows: int = 2) -> None:
    """Call every reward function of ``reward_set`` on stand-in completions of ``records[:rows]``;
    raise one ``ValueError`` naming the function and what was wrong (see the module docstring)."""
    functions = [spec for spec, fn in zip(reward_set.specs, reward_set.fns) if _is_function(fn)]
    records = list(records or [])[:rows]
    if not functions or not records:
        return
    completions = [
        text for record in records for text in (str(record.get("answer", "")) or STAND_IN, STAND_IN)
    ]  # [k * 2]
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in completions]
    columns = {key: [record[key] for record in records for _ in range(2)] for key in records[0]}
    columns.update(completion_ids=ids, completion_lengths=[len(i) for i in ids], truncated=[False] * len(ids))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a stand-in no function applies to is not a fault
            RewardSet(functions).score(completions, columns)
    except (RewardError, ValueError, TypeError, KeyError) as err:
        raise ValueError(
            f"rollout.rewards: {err} (called before training on {len(completions)} stand-in completions of "
            f"{len(records)} training rows)"
        ) from err


def _is_function(fn: Any) -> bool:
    """A plain function (or a partial of one), not a reward object built from a class."""
    return inspect.isroutine(fn) or isinstance(fn, functools.partial)
