"""Episode metrics in ``lightning-grpo report``."""

from __future__ import annotations

from lightning_grpo.cli.agent_report import summary_lines


class FakeRun:
    def __init__(self, series):
        self.series = series

    def values(self, column):
        return self.series.get(column, [])


def test_summary_lines_of_an_agent_run():
    run = FakeRun(
        {
            "train/agent/turns_mean": [1.0] * 10 + [2.0] * 10,
            "train/agent/tool_calls_mean": [0.0] * 10 + [1.0] * 10,
            "train/agent/tool_call_rate": [0.1] * 10 + [0.9] * 10,
            "train/agent/completion_tokens": [2.0] * 20,
            "train/agent/env_tokens": [0.0] * 10 + [27.0] * 10,
            "train/agent/malformed_calls": [1.0, 2.0],
            "train/agent/env_time": [0.01, 0.03],
            "val/tool_call_rate": [0.0, 1.0],
        }
    )
    assert summary_lines(run) == [
        "episodes (first tenth -> last tenth): turns 1.00 -> 2.00, tool calls 0.00 -> 1.00, tool-call rate 0.10 -> 0.90",
        "tokens per episode: sampled 2.00 -> 2.00, environment 0.00 -> 27.00",
        "tool faults over the logged steps: tool_errors 0, tool_timeouts 0, malformed_calls 3, unknown_tools 0; "
        "environment time 0.0200 s per logged step",
        "held-out tool-call rate: 0.000 -> 1.000",
    ]
    assert summary_lines(FakeRun({"train/reward_mean": [0.5]})) == []


def test_agent_rewards():
    from lightning_grpo.data.rewards import REWARDS

    made, env = REWARDS.get("tool_call_made"), REWARDS.get("env_reward")
    calls, truncated = [2, 1, 0, 0], [False, True, False, True]
    assert made(["a"] * 4, tool_calls=calls, truncated=truncated) == [1.0, 0.0, 0.0, 0.0]
    assert made(["a"] * 4, tool_calls=calls, truncated=truncated, require_answer=False) == [1.0, 1.0, 0.0, 0.0]
    assert env(["a", "b"], env_reward=[1, 0.25]) == [1.0, 0.25]
