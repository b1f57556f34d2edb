"""The episode settings of `AgentRolloutCallback` (``rollout.agent``): the environment and the limits of an episode."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass
class AgentSettings:
    """What an episode is: its environment, how long it may run, where a turn ends and how its reset is seeded.

    ``rollout.agent: {environment: calculator, max_turns: 6}`` in YAML (``rollout.class_path:
    lightning_grpo.AgentRolloutCallback``).
    """

    environment: str = "secret_digit"
    """Registry name (``ENVIRONMENTS``: "secret_digit", "calculator") or import path of an `Environment` class;
    one object is built per episode."""
    environment_args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of that class."""
    max_turns: int = 4
    """Model turns per episode (then it ends as truncated)."""
    max_episode_tokens: int | None = None
    """Tokens after the prompt (sampled + environment) per episode; None = the engine's maximum length only.
    ``rollout.sampling.max_new_tokens`` limits each turn."""
    env_workers: int = 8
    """Threads running environment steps (tool calls) at once."""
    stop_tokens: list[str] | None = None
    """Tokens that end a turn besides EOS; None = the chat template's end-of-turn token and every token ending
    with ``</tool_call>``."""
    reset_seed: Literal["group", "episode"] = "group"
    """How the environment's reset is seeded. "group": the ``sampling.n`` episodes of a record share the environment's reset seed, so a group is one
    task with one opening (its advantage baseline compares like with like); "episode": each episode gets its
    own seed (and is trained on its own opening)."""
    allow_mixed_task_groups: bool = False
    """With ``reset_seed: episode`` and ``n > 1``, accept that a group's episodes may face different tasks, so
    its baseline is the mean reward over those tasks (refused otherwise; docs/guide/agents.md)."""
