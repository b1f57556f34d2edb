"""OpenEnv environments as lightning-grpo environments: in-process, or remote through OpenEnv's client.

OpenEnv (``pip install 'lightning-grpo[openenv]'``, the ``openenv-core`` package, imported as
``openenv``): an ``Environment[Action, Observation, State]`` with ``reset(seed, episode_id, **kwargs)``
and ``step(action)``, each returning an ``Observation`` (pydantic) that carries ``done``, ``reward``
and ``metadata``. As ``openenv init`` writes one (``class X(Environment)``, ``reset(self)``), the
action class is read from ``step``'s annotation, and ``reset`` gets only the arguments its signature
takes (the seed, ``reset_kwargs``, ``reset_columns``), as OpenEnv's server calls it. An episode here:

- opens with one user message: the record's ``prompt_key`` column (when set), then the reset
  observation as text (an optional ``system_prompt`` before it);
- every model turn, decoded without special tokens, becomes an action: ``action_from_text(text)``,
  by default the action class built with the text in its one required string field (``action_field``);
- the observation the step returns becomes the next user message (``observation_to_text``; by
  default its one field besides done / reward / metadata, else those fields as JSON), its ``reward``
  the turn's reward (None counts 0), and ``done`` ends the episode;
- a turn that does not make a valid action is answered ``error: invalid action: ...`` and counted
  (``invalid_actions``), or raises with ``invalid_action="raise"``.

:class:`OpenEnvEnvironment` runs the environment class in this process, one object per episode.
:class:`OpenEnvClientEnvironment` talks to a running OpenEnv server through OpenEnv's own client
(``GenericEnvClient`` or the environment's typed ``EnvClient``): sessions live on the server's
WebSocket ``/ws`` endpoint (its HTTP ``/reset`` and ``/step`` are stateless), so every episode opens
its own session at ``reset`` and closes it in ``finish``. The server must accept as many sessions
as episodes run at once (``create_app(..., max_concurrent_envs=N)``, N >= records x ``sampling.n``;
OpenEnv's default is 1).
"""

from __future__ import annotations

import inspect
import json
import typing
from collections.abc import Callable
from typing import Any, Literal

from ..agents.environment import Environment, Messages, Step, Turn
from ..data.records import dataset_row, is_chat
from ._common import SessionTimeouts, optional, require, resolve

EXTRA = "openenv"
_OBS_BOOKKEEPING = {"done", "reward", "metadata"}
_EXAMPLE = "'my_pkg.envs.parse_action'"


class InvalidAction(ValueError):
    """The environment (a server's Action model) rejected the action made from the model's turn."""


def _generic_arg(cls: type, origin_name: str, bound: type) -> type | None:
    """The first type argument of ``cls``'s ``origin_name[...]`` base that subclasses ``bound``
    (the probes read an OpenEnv class and its typing bases: third-party objects)."""
    for klass in getattr(cls, "__mro__", ()):
        for base in getattr(klass, "__orig_bases__", ()):
            origin = typing.get_origin(base)
            if getattr(origin, "__name__", None) == origin_name:
                for arg in typing.get_args(base):
                    if isinstance(arg, type) and issubclass(arg, bound):
                        return arg
    return None


def _step_action(cls: type, bound: type) -> type | None:
    """The class of ``cls.step``'s action (first) parameter, from its type annotation, when it subclasses
    ``bound`` (an environment written as ``class X(Environment)``, as ``openenv init`` writes it)."""
    step = getattr(cls, "step", None)  # an OpenEnv class and its typing bases (third-party)
    params = list(inspect.signature(step).parameters.values())[1:] if callable(step) else []
    if not params:
        return None
    try:
        hint = typing.get_type_hints(step).get(params[0].name)
    except Exception:  # noqa: BLE001 - an annotation that does not resolve: no class from it
        return None
    return hint if isinstance(hint, type) and issubclass(hint, bound) else None


def reset_arguments(reset: Callable[..., Any]) -> tuple[set[str], bool]:
    """The keyword arguments ``reset`` accepts, and whether it takes any (``**kwargs``)."""
    params = inspect.signature(reset).parameters.values()
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return named, any(p.kind == p.VAR_KEYWORD for p in params)


def _text_field(action_cls: type, where: str) -> str:
    """The action's one required string field (besides ``metadata``), or a ValueError naming its fields."""
    fields = {k: f for k, f in action_cls.model_fields.items() if k != "metadata"}
    text = [k for k, f in fields.items() if f.is_required() and f.annotation is str]
    if len(text) == 1:
        return text[0]
    if len(fields) == 1:
        return next(iter(fields))
    raise ValueError(
        f"{where}: cannot tell which field of {action_cls.__name__} (fields {sorted(fields)}) receives the model's "
        f"text; set action_field, or action_from_text (an import path like {_EXAMPLE})"
    )


def default_observation_text(observation: Any) -> str:
    """An observation as text: its one field besides done / reward / metadata, else those fields as JSON."""
    if hasattr(observation, "model_dump"):  # an OpenEnv observation (pydantic, third-party)
        observation = observation.model_dump(exclude=_OBS_BOOKKEEPING)
    if not isinstance(observation, dict):
        return str(observation)
    fields = {k: v for k, v in observation.items() if k not in _OBS_BOOKKEEPING}
    if len(fields) == 1:
        value = next(iter(fields.values()))
        return value if isinstance(value, str) else json.dumps(value, default=str)
    return json.dumps(fields, default=str)


class _OpenEnvBase(Environment):
    """Text <-> action / observation mapping and the episode loop shared by both adapters."""

    action_cls: type | None = None

    def __init__(
        self,
        action: str | type | None,
        action_field: str | None,
        action_from_text: str | Callable | None,
        observation_to_text: str | Callable | None,
        prompt_key: str | None,
        system_prompt: str | None,
        reset_kwargs: dict[str, Any] | None,
        reset_columns: list[str] | None,
        invalid_action: Literal["message", "raise"],
    ) -> None:
        where = type(self).__name__
        if invalid_action not in ("message", "raise"):
            raise ValueError(f"{where}.invalid_action must be 'message' or 'raise', got {invalid_action!r}")
        if action is not None:
            self.action_cls = resolve(action, f"{where}.action", "'my_pkg.models.MyAction'")
        self.parse = optional(action_from_text, f"{where}.action_from_text", _EXAMPLE)
        if self.parse is None:
            if self.action_cls is None and action_field is None:
                raise ValueError(
                    f"{where}: {self._unknown_action()}; set action (its import path), action_field, or action_from_text"
                )
            if (
                self.action_cls is not None
                and action_field is not None
                and action_field not in self.action_cls.model_fields
            ):
                raise ValueError(
                    f"{where}.action_field {action_field!r} is not a field of {self.action_cls.__name__}; fields: {sorted(self.action_cls.model_fields)}"
                )
            self.action_field = action_field or _text_field(self.action_cls, where)
        self.to_text = (
            optional(observation_to_text, f"{where}.observation_to_text", "'my_pkg.envs.render'")
            or default_observation_text
        )
        self.prompt_key, self.system_prompt = prompt_key, system_prompt
        self.reset_kwargs, self.reset_columns = dict(reset_kwargs or {}), list(reset_columns or [])
        self.invalid_action = invalid_action
        self.invalid_actions = 0
        self.tokenizer: Any = None  # set by the episode runner before reset
        self.seed: int | None = None  # this episode's reset seed

    def _unknown_action(self) -> str:
        """The unknown-action error, saying where the class was looked for."""
        return "the action class is unknown"

    # ----------------------------------------------------------------- the two transports
    def _reset(self, seed: int, kwargs: dict[str, Any]) -> Any:
        raise NotImplementedError

    def _step(self, action: Any) -> tuple[Any, Any, bool]:
        """(observation, reward, done) after ``action``; raises :class:`InvalidAction` when the environment
        rejects the action itself (a server's Action model), any other error for a failing environment."""
        raise NotImplementedError

    # ----------------------------------------------------------------------- the episode
    def reset(self, record: dict[str, Any], seed: int) -> Messages:
        where = type(self).__name__
        row = dataset_row(record)  # the prompt before our chat template, no internal keys
        missing = [c for c in self.reset_columns + ([self.prompt_key] if self.prompt_key else []) if c not in row]
        if missing:
            raise KeyError(f"{where}: the record has no column {missing[0]!r}; its columns: {sorted(row)}")
        self.seed = seed
        observation = self._reset(seed, {**self.reset_kwargs, **{c: row[c] for c in self.reset_columns}})
        prompt = row[self.prompt_key] if self.prompt_key else None
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        text = self.to_text(observation)
        if is_chat(prompt):  # the data's chat messages, then the observation as a user message
            return system + [dict(m) for m in prompt] + ([{"role": "user", "content": text}] if text else [])
        parts = [str(prompt)] if prompt is not None else []
        parts.append(text)
        return system + [{"role": "user", "content": "\n\n".join(p for p in parts if p)}]

    def step(self, turn: Turn) -> Step:
        text = self.tokenizer.decode(turn.ids, skip_special_tokens=True) if self.tokenizer is not None else turn.text
        try:
            action = self.parse(text) if self.parse is not None else self._action(text)
        except (ValueError, TypeError) as err:  # pydantic's ValidationError is a ValueError
            return self._invalid(text, err)
        try:
            observation, reward, done = self._step(action)
        except InvalidAction as err:
            return self._invalid(text, err)
        return Step(
            [{"role": "user", "content": self.to_text(observation)}], reward=float(reward or 0.0), done=bool(done)
        )

    def _invalid(self, text: str, err: Exception) -> Step:
        """The answer to a turn that is not a valid action (or the error, with ``invalid_action="raise"``)."""
        if self.invalid_action == "raise":
            raise ValueError(
                f"{type(self).__name__}: the model's turn {text!r:.80} is not a valid action: {err}"
            ) from err
        self.invalid_actions += 1
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return Step([{"role": "user", "content": f"error: invalid action: {first}"}])

    def _action(self, text: str) -> Any:
        return {self.action_field: text} if self.action_cls is None else self.action_cls(**{self.action_field: text})

    def metrics(self) -> dict[str, float]:
        return {"invalid_actions": float(self.invalid_actions)}


class OpenEnvEnvironment(_OpenEnvBase):
    """An OpenEnv ``Environment`` subclass run in this process (one object per episode).

    Args:
        env: the environment class (or its import path, or a factory function), built with ``env_args``.
        env_args: keyword arguments of ``env``.
        action: the Action class; None = the one in ``Environment[Action, Observation, State]``.
        action_field: the action field that receives the model's text; None = its one required
            ``str`` field.
        action_from_text: ``fn(text) -> Action`` (or import path) instead of ``action_field``.
        observation_to_text: ``fn(observation) -> str`` (or import path); None = see the module docstring.
        prompt_key: record column shown before the first observation (e.g. ``"prompt"``); None = none.
        system_prompt: system message of every episode; None = none.
        reset_kwargs: keyword arguments of every ``env.reset`` (besides ``seed``).
        reset_columns: record columns passed to ``env.reset`` as keyword arguments.
        invalid_action: "message" answers a turn that is not a valid action with an error message;
            "raise" stops the run.
    """

    def __init__(
        self,
        env: str | Callable[..., Any],
        env_args: dict[str, Any] | None = None,
        action: str | type | None = None,
        action_field: str | None = None,
        action_from_text: str | Callable | None = None,
        observation_to_text: str | Callable | None = None,
        prompt_key: str | None = None,
        system_prompt: str | None = None,
        reset_kwargs: dict[str, Any] | None = None,
        reset_columns: list[str] | None = None,
        invalid_action: Literal["message", "raise"] = "message",
    ) -> None:
        server = require("openenv.core.env_server", EXTRA, "OpenEnvEnvironment")
        make = resolve(env, "OpenEnvEnvironment.env", "'my_pkg.server.MyEnvironment'")
        self.env = make(**dict(env_args or {}))
        if not isinstance(self.env, server.Environment):
            raise TypeError(
                f"OpenEnvEnvironment.env built a {type(self.env).__name__}, not an openenv Environment "
                "(subclass openenv.core.env_server.Environment[Action, Observation, State])"
            )
        cls = type(self.env)
        self.action_cls = _generic_arg(cls, "Environment", server.Action) or _step_action(cls, server.Action)
        self._observation_cls = server.Observation
        super().__init__(
            action,
            action_field,
            action_from_text,
            observation_to_text,
            prompt_key,
            system_prompt,
            reset_kwargs,
            reset_columns,
            invalid_action,
        )
        self._reset_names, self._reset_any = reset_arguments(self.env.reset)
        for field, names in (("reset_kwargs", self.reset_kwargs), ("reset_columns", self.reset_columns)):
            refused = [n for n in names if not self._reset_any and n not in self._reset_names]
            if refused:
                takes = ", ".join(sorted(self._reset_names)) or "nothing"
                raise ValueError(
                    f"OpenEnvEnvironment.{field}: {cls.__name__}.reset() takes no argument {refused[0]!r} "
                    f"(it takes: {takes}); remove it, or add it to reset's parameters"
                )

    def _unknown_action(self) -> str:
        name = type(self.env).__name__
        return f"the action class of {name} is unknown (no Environment[Action, ...] parameters, no annotation on step's 'action')"

    @property
    def unwrapped(self) -> Any:
        return self.env

    def _checked(self, observation: Any, method: str) -> Any:
        if not isinstance(observation, self._observation_cls):
            raise TypeError(
                f"{type(self.env).__name__}.{method} returned a {type(observation).__name__}, not an openenv Observation"
            )
        return observation

    def _reset(self, seed: int, kwargs: dict[str, Any]) -> Any:
        """``env.reset`` with the seed when its signature takes one (as OpenEnv's server filters reset's
        arguments: the ``openenv init`` template's ``reset(self)`` takes none)."""
        if self._reset_any or "seed" in self._reset_names:
            kwargs = {"seed": seed, **kwargs}
        return self._checked(self.env.reset(**kwargs), "reset")

    def _step(self, action: Any) -> tuple[Any, Any, bool]:
        observation = self._checked(self.env.step(action), "step")
        return observation, observation.reward, observation.done

    def finish(self) -> float:
        self.env.close()
        return 0.0


class OpenEnvClientEnvironment(_OpenEnvBase):
    """A running OpenEnv server, through OpenEnv's client: one WebSocket session per episode.

    Args:
        base_url: the server (``http://127.0.0.1:8000``; ``ws://`` works too).
        client: the client class (or its import path): ``openenv.core.GenericEnvClient`` (plain
            dicts; set ``action_field``) or the environment's typed ``EnvClient`` subclass.
        timeouts: seconds to open a session and per reset / step answer (`SessionTimeouts`, or a mapping).
        action, action_field, action_from_text, observation_to_text, prompt_key, system_prompt,
            reset_kwargs, reset_columns, invalid_action: as in :class:`OpenEnvEnvironment`; the
            action class defaults to the typed client's ``EnvClient[Action, ...]`` parameter.
    """

    def __init__(
        self,
        base_url: str,
        client: str | type = "openenv.core.GenericEnvClient",
        action: str | type | None = None,
        action_field: str | None = None,
        action_from_text: str | Callable | None = None,
        observation_to_text: str | Callable | None = None,
        prompt_key: str | None = None,
        system_prompt: str | None = None,
        reset_kwargs: dict[str, Any] | None = None,
        reset_columns: list[str] | None = None,
        invalid_action: Literal["message", "raise"] = "message",
        timeouts: SessionTimeouts | dict[str, float] = SessionTimeouts(),  # noqa: B008 - frozen settings, never mutated
    ) -> None:
        self.timeouts = SessionTimeouts.of(timeouts)
        core = require("openenv.core", EXTRA, "OpenEnvClientEnvironment")
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://", "ws://", "wss://")):
            raise ValueError(
                f"OpenEnvClientEnvironment.base_url must be an http(s):// or ws(s):// URL, got {base_url!r}"
            )
        self.client_cls = resolve(client, "OpenEnvClientEnvironment.client", "'my_env.client.MyEnvClient'")
        if not (isinstance(self.client_cls, type) and issubclass(self.client_cls, core.EnvClient)):
            raise TypeError(
                f"OpenEnvClientEnvironment.client must be an openenv EnvClient subclass, got {self.client_cls!r}"
            )
        from pydantic import BaseModel

        self.action_cls = _generic_arg(self.client_cls, "EnvClient", BaseModel)
        self.base_url = base_url
        self.client: Any = None
        super().__init__(
            action,
            action_field,
            action_from_text,
            observation_to_text,
            prompt_key,
            system_prompt,
            reset_kwargs,
            reset_columns,
            invalid_action,
        )

    def _reset(self, seed: int, kwargs: dict[str, Any]) -> Any:
        self.client = self.client_cls(
            base_url=self.base_url, connect_timeout_s=self.timeouts.connect_s, message_timeout_s=self.timeouts.message_s
        ).sync()
        try:
            self.client.connect()
            return self.client.reset(seed=seed, **kwargs).observation
        except Exception as err:
            raise ConnectionError(
                f"OpenEnvClientEnvironment: no session at {self.base_url} ({type(err).__name__}: {err}). An OpenEnv server "
                "accepts max_concurrent_envs sessions at once (default 1): serve it with create_app(..., "
                "max_concurrent_envs=N), N >= the episodes that run at once (records x sampling.n)"
            ) from err

    def _step(self, action: Any) -> tuple[Any, Any, bool]:
        try:
            result = self.client.step(action)
        except RuntimeError as err:
            if "VALIDATION_ERROR" in str(err):  # the server's Action model rejected it
                raise InvalidAction(str(err)) from err
            raise RuntimeError(f"OpenEnvClientEnvironment: the server at {self.base_url} failed a step: {err}") from err
        return result.observation, result.reward, result.done

    def finish(self) -> float:
        if self.client is not None:
            self.client.close()
            self.client = None
        return 0.0
