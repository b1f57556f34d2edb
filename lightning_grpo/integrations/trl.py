"""TRL-style ``environment_factory`` classes as lightning-grpo environments (no TRL needed).

TRL's ``GRPOTrainer(environment_factory=MyEnv)`` contract, which :class:`TRLEnvironment` follows:

- ``MyEnv()`` builds an environment (here with ``factory_args``, TRL passes none); one object per episode;
- ``reset(**row)`` receives the dataset row's columns and returns None or a string, which is appended
  to the last user message of the prompt;
- every public method other than ``reset`` / ``get_reward`` is a tool: its schema comes from its type
  hints and Google-style docstring; a tool that raises is answered with the error, and the model goes on;
- the episode ends at the first turn without a tool call (or at ``max_turns`` / ``max_episode_tokens``);
- ``get_reward()`` (optional, sync or async) is called once per finished episode: the episode's
  environment reward (the ``env_reward`` reward function). Reward functions may also read the
  instances, as TRL's do: ``def reward(completions, environments, **columns)``.

Async tool methods run to completion on an event loop of their own. Plain-text prompts: keep the
record's ``prompt_key`` column un-templated (``data.format.use_chat_template: false``, the default): the
environment renders the chat itself, with its tools.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ..agents.environment import Messages, check_reward
from ..agents.tools import ToolEnvironment, tool_schema
from ..data.records import dataset_row
from ._common import resolve, synchronous

#: Methods of the contract that are not tools.
RESERVED = ("reset", "get_reward")
_CHECKED: set[type] = set()  # classes whose tool schemas were built once


def public_methods(env: Any) -> list[Callable[..., Any]]:
    """``env``'s tools: its public plain methods except :data:`RESERVED`, by name (properties are not read)."""
    cls = type(env)
    names = [n for n in dir(cls) if not n.startswith("_") and n not in RESERVED]
    return [getattr(env, n) for n in names if inspect.isfunction(inspect.getattr_static(cls, n))]


class TRLEnvironment(ToolEnvironment):
    """A TRL-style environment class (see the module docstring), one instance per episode.

    Args:
        factory: the environment class or a function returning an instance, or its import path
            (``"my_pkg.envs.WordleEnv"``).
        factory_args: keyword arguments of ``factory`` (TRL calls it without any).
        prompt_key: the record column holding the prompt: a string (one user message) or chat messages.
        system_prompt: system message put first (unless the prompt already starts with one).
        timeout_s: seconds one tool call may run.
    """

    def __init__(
        self,
        factory: str | Callable[..., Any],
        factory_args: dict[str, Any] | None = None,
        prompt_key: str = "prompt",
        system_prompt: str | None = None,
        timeout_s: float | None = 10.0,
    ) -> None:
        make = resolve(factory, "TRLEnvironment.factory", "'my_pkg.envs.WordleEnv'")
        self.env = make(**dict(factory_args or {}))
        name = type(self.env).__name__
        if not callable(getattr(self.env, "reset", None)):  # a user's TRL environment (third-party contract)
            raise TypeError(
                f"TRLEnvironment: {name} has no reset(**kwargs) method (TRL's environment_factory contract)"
            )
        get_reward = getattr(self.env, "get_reward", None)  # a user's TRL environment (third-party contract)
        if get_reward is not None and not callable(get_reward):
            raise TypeError(f"TRLEnvironment: {name}.get_reward must be a method, got a {type(get_reward).__name__}")
        self._reset = synchronous(self.env.reset)
        self._get_reward = None if get_reward is None else synchronous(get_reward)
        tools = [synchronous(m) for m in public_methods(self.env)]
        if type(self.env) not in _CHECKED:  # a tool without hints / docstring fails here, once per class
            for tool in tools:
                try:
                    tool_schema(tool)
                except ValueError as err:
                    raise ValueError(
                        f"TRLEnvironment: {name}.{tool.__name__} is public, so it is a tool, but {err}"
                    ) from err
            _CHECKED.add(type(self.env))
        super().__init__(tools, timeout_s=timeout_s)
        self.prompt_key, self.system_prompt = prompt_key, system_prompt

    @property
    def unwrapped(self) -> Any:
        return self.env

    def reset(self, record: dict[str, Any], seed: int) -> Messages:
        name = type(self.env).__name__
        if self.prompt_key not in record:
            raise KeyError(
                f"TRLEnvironment: the record has no column {self.prompt_key!r} (prompt_key); its columns: {sorted(dataset_row(record))}"
            )
        row = dataset_row(record)  # the prompt before our chat template, no internal keys
        prompt = row[self.prompt_key]
        if isinstance(prompt, str):
            messages = [{"role": "user", "content": prompt}]
        elif isinstance(prompt, list) and prompt and all(isinstance(m, dict) and "role" in m for m in prompt):
            messages = [dict(m) for m in prompt]
        else:
            raise TypeError(
                f"TRLEnvironment: column {self.prompt_key!r} must hold a string or chat messages, got {prompt!r:.80}"
            )
        if self.system_prompt and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        observation = self._reset(**row)
        if observation is not None:
            if not isinstance(observation, str):
                raise TypeError(
                    f"{name}.reset returned {observation!r:.60} ({type(observation).__name__}); expected a string or None"
                )
            last = messages[-1]
            if not isinstance(last.get("content"), str):
                raise TypeError(
                    f"TRLEnvironment: cannot append {name}.reset's observation to a non-text message {last!r:.80}"
                )
            messages[-1] = {**last, "content": last["content"] + observation}  # as TRL does: no separator
        return messages

    def finish(self) -> float:
        if self._get_reward is None:
            return 0.0
        return check_reward(self._get_reward(), f"{type(self.env).__name__}.get_reward returned")
