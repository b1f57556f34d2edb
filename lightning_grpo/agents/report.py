"""Episode metrics: turns, tool calls and faults, environment time, sampled vs environment tokens."""

from __future__ import annotations

from .environment import EpisodeState


def successful_calls(state: EpisodeState) -> int:
    """Tool calls of an episode that ran and returned (0 for environments without tools)."""
    m = state.env.metrics()
    return int(m.get("tool_calls", 0) - m.get("unknown_tools", 0) - m.get("tool_errors", 0) - m.get("tool_timeouts", 0))


def episode_metrics(states: list[EpisodeState], env_time: float, prefix: str = "agent/") -> dict[str, float]:
    """Per-episode means (turns, tool calls, tokens) and per-batch totals of the tool faults.

    ``tool_call_rate``: fraction of episodes with at least one successful call.
    ``completion_tokens`` / ``env_tokens``: tokens per episode the model sampled / the environment added.
    """
    n = max(1, len(states))
    counters: dict[str, float] = {}
    for s in states:
        for key, value in s.env.metrics().items():
            counters[key] = counters.get(key, 0.0) + float(value)
    sampled = [sum(1 for t in s.turn_ids if t >= 0) for s in states]
    out = {
        "turns_mean": sum(s.turns for s in states) / n,
        "tool_calls_mean": counters.get("tool_calls", 0.0) / n,
        "tool_call_rate": sum(1 for s in states if successful_calls(s) > 0) / n,
        "completion_tokens": sum(sampled) / n,
        "env_tokens": sum(len(s.ids) - k for s, k in zip(states, sampled)) / n,
        "truncated_frac": sum(1 for s in states if s.truncated) / n,
        "env_time": env_time,
    }
    for key in ("tool_errors", "tool_timeouts", "malformed_calls", "unknown_tools", "invalid_actions"):
        if key in counters:
            out[key] = counters[key]
    return {prefix + k: v for k, v in out.items()}
