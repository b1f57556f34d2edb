"""The lines of ``lightning-grpo report`` about multi-turn episodes (agents): turns, tool calls, faults, tokens.

Read from the run's metrics alone (``train/agent/*``, ``val/tool_call_rate``): nothing of the agents package is
imported, so ``report`` starts without torch."""

from __future__ import annotations

from typing import Any


def summary_lines(run: Any) -> list[str]:
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
