"""The matrix's multi-turn environments: the episode's opening is drawn from its reset seed, so every
episode of a group opens differently and a log (or a trainer) that shows another episode's opening
is caught by recomputing the reward from what it shows.

Both (this module's and the OpenEnv one in ``openenv_env.py``) follow one rule (:func:`answer_of`,
the digit task's ``last_plus_one``): the opening is four digits and ``=``; a first turn starting with ``(last digit + 1) % 10`` scores 1 and ends the episode;
otherwise the environment answers ``again`` and a right second turn scores 0.5.
"""

from __future__ import annotations

import random
from typing import Any

from lightning_grpo.agents.environment import Environment as AgentEnvironment, Messages, Step, Turn

FIRST, SECOND = 1.0, 0.5  # the reward of a right answer at turn 0 / turn 1
AGAIN = "again"


def opening_of(seed: int) -> str:
    """The episode's opening text: four digits drawn from its reset seed, then ``=``."""
    return f"{random.Random(seed).randrange(10000):04d}="


def answer_of(opening: str) -> str:
    """The right answer to an opening ``dddd=``."""
    return str((int(opening[3]) + 1) % 10)


def turn_reward(opening: str, text: str, index: int) -> float:
    """The reward of model turn ``index`` (0 or 1) whose text is ``text``."""
    if text.lstrip()[:1] != answer_of(opening):
        return 0.0
    return FIRST if index == 0 else SECOND


class OpeningDigitsEnv(AgentEnvironment):
    """lightning-grpo's own environment interface (``rollout.init_args.agent.environment``)."""

    def reset(self, record: dict[str, Any], seed: int) -> Messages:
        self.opening = opening_of(seed)
        return [{"role": "user", "content": self.opening}]

    def step(self, turn: Turn) -> Step:
        reward = turn_reward(self.opening, self.tokenizer_free(turn.text), turn.index)
        if reward > 0:
            return Step(reward=reward, done=True)
        return Step(messages=[{"role": "user", "content": AGAIN}])

    @staticmethod
    def tokenizer_free(text: str) -> str:
        """The turn's text without the chat markers the engine may have sampled (``<|im_end|>``)."""
        return text.split("<|")[0]
