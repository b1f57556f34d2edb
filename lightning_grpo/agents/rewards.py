"""Reward functions of multi-turn episodes (registered in ``REWARDS``).

Besides the dataset columns, reward functions of episodes receive (one entry per episode):
``transcript`` (the chat messages, or the decoded text of a plain-text episode), ``env_reward``
(the sum of the environment's per-turn rewards), ``turns`` (model turns), ``tool_calls``
(calls that ran and returned), and ``completion_lengths`` counts sampled tokens only. The
``completions`` are the text of each episode's last model turn (its final answer).
"""

from __future__ import annotations

from typing import Sequence

from lightning_grpo.data.rewards import REWARDS


@REWARDS.register("env_reward")
def env_reward(completions: list[str], env_reward: Sequence[float]) -> list[float]:
    """The environment's reward of each episode (sum over turns)."""
    return [float(r) for r in env_reward]


@REWARDS.register("tool_call_made")
def tool_call_made(completions: list[str], tool_calls: Sequence[int]) -> list[float]:
    """1 when the episode made at least one tool call that ran and returned, else 0 (a format reward)."""
    return [1.0 if n > 0 else 0.0 for n in tool_calls]
