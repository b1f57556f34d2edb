"""The environment interface of multi-turn episodes, and the registry that finds one by name.

An episode starts from a dataset record (:meth:`Environment.reset`), then alternates a model turn
(the engine's sampled token ids and their text, a :class:`Turn`) with the environment's answer
(:meth:`Environment.step` -> :class:`Step`: new messages or text, an optional per-turn reward,
whether the episode is done). One environment object serves one episode, so it may keep state
in ``self``; many episodes run at once, their ``step`` calls in a thread pool.

Environments are looked up by registry name (:data:`ENVIRONMENTS`) or by import path
(``"my_pkg.envs.MyEnv"`` / ``"my_pkg.envs:MyEnv"``), see :func:`resolve_environment`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lightning_grpo.core.registry import Registry
from lightning_grpo.core.resolve import resolve_callable

ENVIRONMENTS: Registry = Registry("environment")

Messages = list[dict[str, Any]]


@dataclass
class Turn:
    """One model turn, as the engine sampled it."""

    ids: list[int]
    """The sampled token ids (the stop / EOS token included when one ended the turn)."""
    text: str
    """``ids`` decoded with special tokens kept (what a parser of the template's markers reads)."""
    index: int
    """0-based turn number in the episode."""
    finished: bool
    """True when the turn ended at EOS / a stop token, False when it hit the turn's token limit."""


@dataclass
class Step:
    """What the environment answers to a model turn."""

    messages: Messages | str | None = None
    """New chat messages (``[{"role": "tool", "content": ...}]``), or plain text appended as it is
    (tokenised without a template), or None for nothing."""
    reward: float = 0.0
    """Reward of this turn; an episode's environment reward is the sum over its turns."""
    done: bool = False
    """True ends the episode (the messages, if any, are then not shown to the model)."""
    assistant: dict[str, Any] | None = None
    """The model's turn as a chat message (content, tool_calls), recorded in the transcript;
    None: ``{"role": "assistant", "content": turn text}``."""


class Environment:
    """Subclass and implement :meth:`reset` and :meth:`step`; one object per episode.

    ``seed`` in :meth:`reset` is reproducible from the run's seed and shared by the G episodes of a
    record (one task per group; ``rollout.agent.reset_seed: episode`` gives each episode its own): draw the
    task's random values from ``random.Random(seed)``, and nothing else, so the G openings agree.
    """

    #: Plain Python functions the model may call (:class:`~lightning_grpo.agents.tools.ToolEnvironment`
    #: executes them); their JSON schemas are rendered into the prompt by the chat template.
    tools: list[Callable[..., Any]] = []

    def reset(self, record: dict[str, Any], seed: int) -> Messages | None:
        """Start an episode from a dataset record: the opening chat messages (rendered with the
        tokenizer's chat template and the tools), or None to use ``record["prompt_ids"]`` as they are."""
        return None

    def step(self, turn: Turn) -> Step:
        """Answer one model turn."""
        raise NotImplementedError(f"{type(self).__name__}.step")

    def metrics(self) -> dict[str, float]:
        """Per-episode counters, averaged over episodes into the logged metrics (e.g. tool calls)."""
        return {}

    def finish(self) -> float:
        """Called once when the episode has ended (done, out of turns or out of tokens), before
        rewards are scored: a final reward added to the episode's environment reward (default 0),
        e.g. a TRL-style ``get_reward()``. Release what the episode holds here (a server session)."""
        return 0.0

    @property
    def unwrapped(self) -> Any:
        """The object reward functions receive in the ``environments`` column: this environment, or the
        foreign object an adapter wraps (:mod:`lightning_grpo.integrations`)."""
        return self


def resolve_environment(name: str | type | Callable[..., Environment]) -> Callable[..., Environment]:
    """The environment class registered as ``name`` or imported from ``"pkg.mod.Cls"`` / ``"pkg.mod:Cls"``."""
    return resolve_callable(name, ENVIRONMENTS, "environment", "'my_pkg.envs.MyEnv'")


def check_messages(value: Any, where: str) -> None:
    """Raise naming ``where`` unless ``value`` is a list of ``{"role": str, "content": ...}`` dicts."""
    if not isinstance(value, list) or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in value):
        raise TypeError(f"{where} must be a list of chat messages (dicts with a 'role'), got {value!r:.120}")


def check_step(env: Any, step: Any) -> Step:
    """``step`` as returned by ``env.step``, or one TypeError naming the environment class and the field."""
    name = type(env).__name__
    if not isinstance(step, Step):
        raise TypeError(
            f"{name}.step must return a lightning_grpo.agents.Step, got {type(step).__name__}: {step!r:.80}"
        )
    if step.messages is not None and not isinstance(step.messages, str):
        check_messages(step.messages, f"{name}.step returned Step.messages, which")
    check_reward(step.reward, f"{name}.step returned Step.reward")
    if not isinstance(step.done, bool):
        raise TypeError(f"{name}.step returned Step.done = {step.done!r}; expected a bool")
    if step.assistant is not None and not isinstance(step.assistant, dict):
        raise TypeError(
            f"{name}.step returned Step.assistant = {step.assistant!r:.80}; expected a message dict or None"
        )
    return step


def check_reward(value: Any, where: str) -> float:
    """``value`` as a float, or one TypeError naming ``where`` unless it is a finite real number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise TypeError(f"{where} = {value!r}; expected a finite float")
    return float(value)


@dataclass
class EpisodeState:
    """Bookkeeping of one running episode (internal to :mod:`lightning_grpo.agents.episodes`)."""

    env: Any
    messages: Messages | None  # the transcript as chat messages (None: a plain-text episode)
    context: list[int]  # prompt + every token so far
    prompt_length: int
    ids: list[int] = field(default_factory=list)  # everything after the prompt
    logprobs: list[float] = field(default_factory=list)
    turn_ids: list[int] = field(default_factory=list)  # model turn per token, -1 on environment tokens
    turns: int = 0
    reward: float = 0.0
    done: bool = False
    truncated: bool = False
    last_text: str = ""  # the last model turn's text (what reward functions score)
