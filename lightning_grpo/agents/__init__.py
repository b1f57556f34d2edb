"""Agentic GRPO: multi-turn environments, tool calls, token-in-token-out episodes (docs/guide/agents.md)."""

from . import calculator as _calculator, secret_digit as _secret_digit  # noqa: F401 - importing them registers them
from .environment import ENVIRONMENTS, Environment, Step, Turn, resolve_environment
from .settings import AgentSettings
from .tools import ToolEnvironment, parse_tool_calls, tool_schema

__all__ = [
    "ENVIRONMENTS",
    "Environment",
    "Step",
    "Turn",
    "ToolEnvironment",
    "AgentRolloutCallback",
    "AgentSettings",
    "parse_tool_calls",
    "resolve_environment",
    "tool_schema",
]


def __getattr__(name: str):
    if name == "AgentRolloutCallback":  # imports Lightning: on first use only
        from .callback import AgentRolloutCallback

        return AgentRolloutCallback
    raise AttributeError(f"module 'lightning_grpo.agents' has no attribute {name!r}")
