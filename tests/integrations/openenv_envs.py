"""Tiny environments written in OpenEnv's own API (imported by the tests and by the server process)."""

from __future__ import annotations

import random
from typing import Any

from openenv.core.env_server import Action, Environment, Observation, State, create_app


class GuessAction(Action):
    guess: str


class GuessObservation(Observation):
    feedback: str = ""


class DigitGuessEnv(Environment[GuessAction, GuessObservation, State]):
    """Guess a hidden digit drawn from the reset seed: 1 for the right digit (done), 0.1 for any other
    digit, 0 for a turn without one; the feedback says higher / lower."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self.target = 0
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GuessObservation:
        self.target = random.Random(seed).randrange(10)
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(feedback="guess a digit")

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        digits = [int(c) for c in action.guess if c.isdigit()]
        if not digits:
            return GuessObservation(feedback="no digit", reward=0.0)
        if digits[0] == self.target:
            return GuessObservation(feedback="right", reward=1.0, done=True)
        return GuessObservation(feedback="higher" if digits[0] < self.target else "lower", reward=0.1)

    @property
    def state(self) -> State:
        return self._state


class NumberAction(Action):
    number: int


class NumberObservation(Observation):
    value: int = 0
    note: str = ""


class NumberEnv(Environment[NumberAction, NumberObservation, State]):
    """An action that is not a string (an int) and an observation with two fields."""

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> NumberObservation:
        self.kwargs = kwargs
        return NumberObservation(value=0, note="start")

    def step(self, action: NumberAction, timeout_s: float | None = None, **kwargs: Any) -> NumberObservation:
        return NumberObservation(value=action.number, note="ok", reward=float(action.number), done=True)

    @property
    def state(self) -> State:
        return State()


def make_app():
    """The server of :class:`DigitGuessEnv` (``uvicorn --factory tests.integrations.openenv_envs:make_app``)."""
    return create_app(DigitGuessEnv, GuessAction, GuessObservation, max_concurrent_envs=16)
