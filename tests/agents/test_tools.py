"""Tool calls: schemas from plain functions, Hermes parsing, and one error message per fault."""

from __future__ import annotations

import time

import pytest

from lightning_grpo.agents.chat import ChatRenderer
from lightning_grpo.agents.environment import Turn
from lightning_grpo.agents.episodes import EpisodeLimits, run_episodes
from lightning_grpo.agents.report import episode_metrics
from lightning_grpo.agents.tools import ToolEnvironment, parse_tool_calls, tool_schema
from lightning_grpo.rollout.base import SamplingConfig
from tests.helpers.agents import ScriptedEngine, ids_of, tools_tokenizer


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first one
        b: the second one
    """
    return a + b


def boom() -> str:
    """Always fails."""
    raise ValueError("kaboom")


def slow() -> str:
    """Takes two seconds."""
    time.sleep(2.0)
    return "late"


class Tools(ToolEnvironment):
    tools = [add, boom, slow]

    def __init__(self):
        super().__init__(timeout_s=0.05)

    def reset(self, record, seed):
        return [{"role": "user", "content": "go"}]


@pytest.fixture(scope="module")
def tok():
    return tools_tokenizer()


def call(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


def step(tok, text):
    env = Tools()
    env.tokenizer = tok
    return env, env.step(Turn(ids=[], text=text, index=0, finished=True))


def test_schema_from_signature_and_docstring():
    assert tool_schema(add) == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "description": "the first one"},
                    "b": {"type": "integer", "description": "the second one"},
                },
                "required": ["a", "b"],
            },
            "return": {"type": "integer"},
        },
    }

    def f(x):
        return x

    with pytest.raises(ValueError, match="tool 'f': cannot build its JSON schema .*because it has no docstring"):
        tool_schema(f)


def test_parse_hermes_calls(tok):
    message, error = parse_tool_calls(
        tok, "let me add" + call('{"name": "add", "arguments": {"a": 2, "b": 3}}') + "<|im_end|>"
    )
    assert error is None and message["content"] == "let me add"
    assert message["tool_calls"] == [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]
    message, error = parse_tool_calls(tok, "7<|im_end|>")
    assert error is None and message == {"role": "assistant", "content": "7"}


def test_good_call_returns_the_result(tok):
    env, out = step(tok, call('{"name": "add", "arguments": {"a": 2, "b": 3}}'))
    assert out.messages == [{"role": "tool", "name": "add", "content": "5"}] and not out.done
    assert env.metrics() == {
        "tool_calls": 1.0,
        "tool_errors": 0.0,
        "tool_timeouts": 0.0,
        "malformed_calls": 0.0,
        "unknown_tools": 0.0,
    }


def test_malformed_call_becomes_an_error_message(tok):
    env, out = step(tok, call('{"name": "add", "arguments": {"a": 2,}}'))
    assert out.messages[0]["role"] == "tool" and not out.done
    assert out.messages[0]["content"].startswith(
        "error: malformed tool call: json parser could not parse region as JSON"
    )
    env2, out2 = step(tok, call('{"function": "add"}'))
    assert (
        out2.messages[0]["content"]
        == 'error: malformed tool call: expected {"name": ..., "arguments": {...}}, got {"function": "add"}'
    )
    assert env.counts["malformed_calls"] == 1 and env2.counts["malformed_calls"] == 1 and env.counts["tool_calls"] == 0


def test_unknown_tool_becomes_an_error_message(tok):
    env, out = step(tok, call('{"name": "mul", "arguments": {}}'))
    assert out.messages == [
        {"role": "tool", "name": "mul", "content": "error: unknown tool 'mul' (available: add, boom, slow)"}
    ]
    assert env.counts["unknown_tools"] == 1


def test_raising_tool_becomes_an_error_message(tok):
    env, out = step(tok, call('{"name": "boom", "arguments": {}}'))
    assert out.messages[0]["content"] == "error: tool 'boom' raised ValueError: kaboom"
    _, bad_args = step(tok, call('{"name": "add", "arguments": {"c": 1}}'))
    assert bad_args.messages[0]["content"].startswith("error: tool 'add' raised TypeError:")
    assert env.counts["tool_errors"] == 1


def test_timeout_becomes_an_error_message(tok):
    start = time.perf_counter()
    env, out = step(tok, call('{"name": "slow", "arguments": {}}'))
    assert out.messages[0]["content"] == "error: tool 'slow' timed out after 0.05 s"
    assert env.counts["tool_timeouts"] == 1 and time.perf_counter() - start < 1.5


def test_faults_never_stop_an_episode(tok):
    """Four turns, four faults, then an answer: the episode runs to the end and the metrics count them."""
    turns = [
        call('{"name": "add", "arguments": {"a": 1,}}'),
        call('{"name": "mul", "arguments": {}}'),
        call('{"name": "boom", "arguments": {}}'),
        call('{"name": "slow", "arguments": {}}'),
        "9<|im_end|>",
    ]
    engine = ScriptedEngine(lambda c, r, p: ids_of(tok, turns[c]))
    renderer = ChatRenderer(tok, Tools.tools)
    stops = [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("</tool_call>")]
    out = run_episodes(
        engine,
        Tools,
        tok,
        renderer,
        [{"prompt_ids": [9]}] * 2,
        SamplingConfig(n=1, max_new_tokens=64, stop_token_ids=stops),
        seed=0,
        limits=EpisodeLimits(max_turns=6),
    )
    ep = out.episodes[0]
    assert ep.turns == 5 and not ep.truncated and ep.last_text == "9"
    errors = [m["content"].split(":")[0] + ":" + m["content"].split(":")[1] for m in ep.messages if m["role"] == "tool"]
    assert errors == [
        "error: malformed tool call",
        "error: unknown tool 'mul' (available",
        "error: tool 'boom' raised ValueError",
        "error: tool 'slow' timed out after 0.05 s",
    ]
    metrics = episode_metrics(out.episodes, out.env_time)
    assert metrics["agent/turns_mean"] == 5 and metrics["agent/tool_calls_mean"] == 3  # malformed is not a call
    assert (
        metrics["agent/malformed_calls"],
        metrics["agent/unknown_tools"],
        metrics["agent/tool_errors"],
        metrics["agent/tool_timeouts"],
    ) == (2, 2, 2, 2)
    assert metrics["agent/tool_call_rate"] == 0.0 and metrics["agent/env_tokens"] > 0
    assert metrics["agent/completion_tokens"] == sum(len(ids_of(tok, t)) for t in turns)
