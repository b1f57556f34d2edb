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


def summary_lines(run) -> list[str]:
    """Lines of ``lightning-grpo report`` about episodes (none when the run logged no agent metrics)."""
    if not run.values("train/agent/turns_mean"):
        return []

    def tenths(column: str) -> str:
        values = run.values(column)
        n = max(1, len(values) // 10)
        return f"{sum(values[:n]) / n:.2f} -> {sum(values[-n:]) / n:.2f}" if values else "not logged"

    faults = {
        k: sum(run.values(f"train/agent/{k}"))
        for k in ("tool_errors", "tool_timeouts", "malformed_calls", "unknown_tools")
    }
    env_time = run.values("train/agent/env_time")
    lines = [
        f"episodes (first tenth -> last tenth): turns {tenths('train/agent/turns_mean')}, "
        f"tool calls {tenths('train/agent/tool_calls_mean')}, tool-call rate {tenths('train/agent/tool_call_rate')}",
        f"tokens per episode: sampled {tenths('train/agent/completion_tokens')}, environment {tenths('train/agent/env_tokens')}",
        "tool faults over the logged steps: "
        + ", ".join(f"{k} {v:.0f}" for k, v in faults.items())
        + (f"; environment time {sum(env_time) / len(env_time):.4f} s per logged step" if env_time else ""),
    ]
    rate = run.values("val/tool_call_rate")
    if rate:
        lines.append(f"held-out tool-call rate: {rate[0]:.3f} -> {rate[-1]:.3f}")
    return lines
