"""The matrix's environment in OpenEnv's API (``rollout: openenv``), run in process by
``lightning_grpo.integrations.openenv.OpenEnvEnvironment``; its rule is :mod:`tests.e2e.matrix.envs`'s."""

from __future__ import annotations

from typing import Any

from openenv.core.env_server import Action, Environment, Observation, State

from .envs import AGAIN, opening_of, turn_reward


class DigitsAction(Action):
    guess: str


class DigitsObservation(Observation):
    text: str = ""


class OpeningDigitsOpenEnv(Environment[DigitsAction, DigitsObservation, State]):
    """The same task in OpenEnv's API (run in process by ``lightning_grpo.integrations.openenv.OpenEnvEnvironment``)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self.opening, self.turn = "0000=", 0
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> DigitsObservation:
        self.opening, self.turn = opening_of(int(seed or 0)), 0
        self._state = State(episode_id=episode_id, step_count=0)
        return DigitsObservation(text=self.opening)

    def step(self, action: DigitsAction, timeout_s: float | None = None, **kwargs: Any) -> DigitsObservation:
        reward = turn_reward(self.opening, action.guess, self.turn)
        self.turn += 1
        self._state.step_count = self.turn
        if reward > 0:
            return DigitsObservation(text="right", reward=reward, done=True)
        return DigitsObservation(text=AGAIN, reward=0.0)

    @property
    def state(self) -> State:
        return self._state
