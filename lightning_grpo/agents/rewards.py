"""Reward functions of multi-turn episodes (registered in ``REWARDS``).

Besides the dataset columns, reward functions of episodes receive (one entry per episode):
``transcript`` (the chat messages, or the decoded text of a plain-text episode), ``env_reward``
(the sum of the environment's per-turn rewards), ``turns`` (model turns), ``tool_calls``
(calls that ran and returned), ``environments`` (each episode's environment object, after
``finish``: what TRL's reward functions read; an adapter's wrapped object, see
:mod:`lightning_grpo.integrations`), and ``completion_lengths`` counts sampled tokens only. The
``completions`` are the text of each episode's last model turn (its final answer).
"""

from __future__ import annotations

from lightning_grpo.data.rewards import env_reward, tool_call_made  # registered there (always present)

__all__ = ["env_reward", "tool_call_made"]
