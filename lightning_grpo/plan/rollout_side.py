"""RolloutSide: the rollout's settings as the run plan reads them, handed over by the rollout callback (a layer
above the plan) through ``RolloutCallback.plan_side``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..rollout.base import RolloutEngine, SamplingConfig
from ..rollout.engine_settings import EngineSettings


def _no_conversations(records: list[dict]) -> list:
    return []


def _no_probe(records: list[dict], tokenizer: Any) -> None:
    return None


@dataclass(frozen=True)
class RolloutSide:
    """The rollout's settings as the plan reads them (``RolloutCallback.plan_side`` builds it)."""

    engine_settings: EngineSettings
    """``rollout.engine`` as set: the engine's typed settings (`VLLMArgs`, `ServerSettings`, `HFSettings`, ...)."""
    engine: RolloutEngine | None
    """An engine handed over with ``use_engine`` (its own ``max_model_len`` holds), else None."""
    sampling: SamplingConfig
    """``rollout.sampling``."""
    group_size: int
    """Completions per prompt that train (``sampling.n``, or ``selection.gfpo_keep``)."""
    group_field: str
    """The option that sets `group_size`, as written in a recipe."""
    completion_budget: int | None
    """Tokens a sample may take after its prompt (None: no bound known, so ``max_model_len`` must be set)."""
    budget_field: str
    """The option(s) that set `completion_budget`."""
    seed: int | None
    """``rollout.seed``: a pinned sampling seed, or None for the run seed."""
    max_staleness: int
    """``rollout.max_staleness``."""
    lora_sync: str
    """``rollout.weight_sync.lora``: "merged" or "adapter"."""
    sync_enabled: bool
    """``rollout.weight_sync.enabled``."""
    servers: tuple[tuple[str, str, str], ...] = ()
    """(option, URL, remedy) of every server the rollout talks to (checked reachable)."""
    conversations: Callable[[list[dict]], list] = _no_conversations
    """Records -> the multi-turn conversations the chat-template check renders (none for single turns)."""
    probe_rewards: Callable[[list[dict], Any], None] = _no_probe
    """Runs every reward function on stand-in completions of (records, tokenizer)."""
