"""Turn-synchronous, batched, token-in-token-out episodes.

A group is one task: the G episodes of a record are reset with one seed (``reset_seed="group"``) and
must open alike; with ``reset_seed="episode"`` each episode gets its own seed, and each row of the
rollout keeps its own opening (``Rollout.row_prompt_ids``), which the trainer scores it after.

Every episode of a generation batch is one token sequence, grown turn by turn:

    prompt | sampled turn 0 | environment tokens | sampled turn 1 | environment tokens | ...

All live episodes sample their next turn in ONE engine call (n = 1 per episode, each request
seeded on its own); a turn ends at EOS, at a stop token (the template's end-of-turn /
end-of-tool-call marker, ``SamplingConfig.stop_token_ids``) or after ``max_new_tokens``. The
environments then answer in a thread pool. The sampled ids enter the sequence as the engine
returned them, with the engine's log-probs; only the environment's new messages are rendered and
tokenised (:class:`~lightning_grpo.agents.chat.ChatRenderer`), so the trainer scores exactly the
tokens that were sampled (never a decode -> encode round trip). ``turn_ids`` marks each sampled
token with its turn and environment tokens with -1 (loss mask 0, log-prob 0).

An episode ends when the environment says done; ``max_turns``, ``max_episode_tokens`` (tokens
after the prompt) and the engine's maximum length end it as truncated (like a completion cut at
``max_new_tokens``: the overlong filter and shaping apply). Every environment's ``finish()`` then
runs once (in the thread pool): its return value is added to the episode's environment reward.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from ..rollout.base import Rollout, RolloutEngine, SamplingConfig, request_seed
from .chat import ChatRenderer
from .environment import EpisodeState, Step, Turn, check_messages, check_reward, check_step


@dataclass
class EpisodeLimits:
    """When an episode stops."""

    max_turns: int = 4
    """Model turns per episode; an episode still running after them is truncated."""
    max_episode_tokens: int | None = None
    """Tokens after the prompt (sampled + environment); None = only the engine's maximum length."""
    max_model_len: int | None = None
    """The engine's longest sequence (prompt + everything); None = no limit."""
    workers: int = 8
    """Threads that run environment steps (tool calls) at once."""

    def __post_init__(self) -> None:
        if not isinstance(self.max_turns, int) or self.max_turns < 1:
            raise ValueError(f"max_turns must be an integer >= 1, got {self.max_turns!r}")
        if self.max_episode_tokens is not None and self.max_episode_tokens < 1:
            raise ValueError(f"max_episode_tokens must be >= 1 or null, got {self.max_episode_tokens!r}")
        if self.workers < 1:
            raise ValueError(f"env_workers must be >= 1, got {self.workers!r}")


@dataclass
class EpisodeRollout(Rollout):
    """A :class:`Rollout` of episodes (``turn_ids`` set), with each row's :class:`EpisodeState`."""

    episodes: list[EpisodeState] = field(default_factory=list)
    env_time: float = 0.0  # seconds spent in environment steps (tool calls)


ResetSeed = Literal["group", "episode"]


def start_episodes(
    make_env: Callable[[], Any],
    records: list[dict],
    group_size: int,
    seed: int,
    tokenizer: Any,
    renderer: ChatRenderer | None,
    reset_seed: ResetSeed = "group",
) -> list[EpisodeState]:
    """G episodes per record (row p*G+g = record p), each with its own environment; the reset seed is
    the record's (``reset_seed="group"``: the group faces one task) or the episode's own ("episode")."""
    states = []
    for i in range(len(records) * group_size):
        env = make_env()
        if hasattr(env, "tokenizer") and getattr(env, "tokenizer", None) is None:  # a user's environment (third-party)
            env.tokenizer = tokenizer
        record = records[i // group_size]
        key = i // group_size if reset_seed == "group" else i
        opening = env.reset(record, request_seed(seed ^ 0x5EED, key) & 0x7FFFFFFF)
        if opening is None:
            prompt, messages = list(record["prompt_ids"]), None
        else:
            check_messages(opening, f"{type(env).__name__}.reset returned a value that")
            if renderer is None:
                raise ValueError(
                    f"{type(env).__name__}.reset returned chat messages but the tokenizer has no chat template"
                )
            prompt, messages = renderer.prompt_ids(opening), list(opening)
        states.append(EpisodeState(env=env, messages=messages, context=prompt, prompt_length=len(prompt)))
    if reset_seed == "group":
        _check_one_opening(states, group_size)
    return states


def _check_one_opening(states: list[EpisodeState], group_size: int) -> None:
    """One ValueError unless the episodes of each group (one record, one reset seed) open alike."""
    for p in range(0, len(states), group_size):
        first = states[p].context[: states[p].prompt_length]
        for g, s in enumerate(states[p + 1 : p + group_size], 1):
            if s.context[: s.prompt_length] != first:
                _finish_quietly(states)
                name = type(getattr(s.env, "unwrapped", s.env)).__name__  # the user's class, not an adapter
                raise ValueError(
                    f"{name}.reset gave the episodes of record {p // group_size} different openings (episode 0 and {g}) "
                    "for the same record and reset seed, so its group is not one task: make the opening depend only on "
                    "the record and the seed, or set rollout.agent.reset_seed: episode and rollout.agent.allow_mixed_task_groups: "
                    "true (each episode then trains on its own opening; docs/guide/agents.md)"
                )


def run_episodes(
    engine: RolloutEngine,
    make_env: Callable[[], Any],
    tokenizer: Any,
    renderer: ChatRenderer | None,
    records: list[dict],
    sampling: SamplingConfig,
    seed: int,
    limits: EpisodeLimits,
    reset_seed: ResetSeed = "group",
) -> EpisodeRollout:
    """Run ``sampling.n`` episodes per record to the end; rows group-contiguous as in :class:`Rollout`,
    each row with its own opening (``row_prompt_ids``)."""
    G = sampling.n
    states = start_episodes(make_env, records, G, seed, tokenizer, renderer, reset_seed)
    turn_sampling = replace(sampling, n=1)
    env_time = 0.0
    with ThreadPoolExecutor(max_workers=limits.workers, thread_name_prefix="env") as pool:
        try:
            for t in range(limits.max_turns):
                live = [s for s in states if not s.done and _room(s, turn_sampling, limits)]
                if not live:
                    break
                out = engine.generate([s.context for s in live], turn_sampling, request_seed(seed, t) & 0x7FFFFFFF)
                turns = []
                for s, ids, lps, fin in zip(live, out.completion_ids, out.logprobs, out.finished):
                    ids, lps, fin = _within_budget(s, ids, lps, fin, limits)
                    _append(s, ids, lps, t)
                    s.turns += 1
                    text = tokenizer.decode(ids, skip_special_tokens=False)
                    turns.append(Turn(ids=list(ids), text=text, index=t, finished=fin))
                start = time.perf_counter()
                steps = list(pool.map(lambda st: check_step(st[0].env, st[0].env.step(st[1])), zip(live, turns)))
                env_time += time.perf_counter() - start
                for s, turn, step in zip(live, turns, steps):
                    _apply_step(s, turn, step, renderer, tokenizer, limits, last_turn=t == limits.max_turns - 1)
        except BaseException:
            _finish_quietly(states)  # release server sessions etc. before the error propagates
            raise
        for s in states:
            if not s.done:  # out of turns or out of room
                s.done, s.truncated = True, True
        start = time.perf_counter()
        for s, final in zip(states, pool.map(_finish, states)):
            s.reward += final
        env_time += time.perf_counter() - start
    return EpisodeRollout(
        prompt_ids=[states[p * G].context[: states[p * G].prompt_length] for p in range(len(records))],
        row_prompt_ids=[s.context[: s.prompt_length] for s in states],  # [P*G] each episode's own opening
        completion_ids=[s.ids for s in states],
        logprobs=[s.logprobs for s in states],
        finished=[not s.truncated for s in states],
        group_size=G,
        turn_ids=[s.turn_ids for s in states],
        episodes=states,
        env_time=env_time,
    )


def _finish(s: EpisodeState) -> float:
    """The environment's final reward (:meth:`Environment.finish`; 0 for one without the hook)."""
    finish = getattr(s.env, "finish", None)  # a user's environment (third-party): finish is optional
    return 0.0 if finish is None else check_reward(finish(), f"{type(s.env).__name__}.finish returned")


def _finish_quietly(states: list[EpisodeState]) -> None:
    for s in states:
        with contextlib.suppress(Exception):  # an earlier error is already propagating
            _finish(s)


def _room(s: EpisodeState, sampling: SamplingConfig, limits: EpisodeLimits) -> bool:
    """Whether another turn fits; an episode without room ends truncated."""
    fits = limits.max_model_len is None or len(s.context) + sampling.max_new_tokens <= limits.max_model_len
    budget = limits.max_episode_tokens is None or len(s.ids) < limits.max_episode_tokens
    if not (fits and budget):
        s.done, s.truncated = True, True
    return fits and budget


def _within_budget(s: EpisodeState, ids: list[int], lps: list[float], fin: bool, limits: EpisodeLimits):
    """Cut a sampled turn at the episode's token budget (the episode then ends truncated)."""
    if limits.max_episode_tokens is not None and len(s.ids) + len(ids) > limits.max_episode_tokens:
        keep = limits.max_episode_tokens - len(s.ids)
        s.truncated = True
        return ids[:keep], lps[:keep], False
    return ids, lps, fin


def _append(s: EpisodeState, ids: list[int], lps: list[float], turn: int) -> None:
    s.ids += ids
    s.context += ids
    s.logprobs += lps
    s.turn_ids += [turn] * len(ids)


def _apply_step(
    s: EpisodeState,
    turn: Turn,
    step: Step,
    renderer: ChatRenderer | None,
    tokenizer: Any,
    limits: EpisodeLimits,
    last_turn: bool,
) -> None:
    """Record the environment's answer; append its tokens unless the episode ends here."""
    s.reward += float(step.reward)
    assistant = step.assistant or {"role": "assistant", "content": _strip_end(turn.text, tokenizer, renderer)}
    s.last_text = assistant.get("content") or ""
    if s.messages is not None:
        s.messages.append(assistant)
    if s.truncated or step.done or last_turn:
        s.done = True
        s.truncated = s.truncated or not step.done
        return
    if step.messages is None:
        obs: list[int] = []
    elif isinstance(step.messages, str):
        obs = list(tokenizer(step.messages, add_special_tokens=False)["input_ids"])
    else:
        if s.messages is None:
            raise TypeError(
                f"{type(s.env).__name__}.step returned Step.messages as chat messages, but the episode started "
                "from plain-text prompt ids (reset returned None): return text instead"
            )
        obs = renderer.observation_ids(s.messages, step.messages, turn.text)
        s.messages.extend(step.messages)
    if limits.max_episode_tokens is not None and len(s.ids) + len(obs) >= limits.max_episode_tokens:
        s.done, s.truncated = True, True
        return
    s.ids += obs
    s.context += obs
    s.logprobs += [0.0] * len(obs)
    s.turn_ids += [-1] * len(obs)


def _strip_end(text: str, tokenizer: Any, renderer: ChatRenderer | None) -> str:
    """The turn's text without the EOS / end-of-turn marker that ended it."""
    for marker in (tokenizer.eos_token, renderer.end_of_turn.strip() if renderer else None):
        if marker and text.endswith(marker):
            text = text[: -len(marker)]
    return text
