"""Tool calling: plain Python functions as tools, calls parsed from the model's turn, results as
tool messages.

- Schemas: ``transformers.utils.get_json_schema`` (signature + Google-style docstring), rendered
  by the chat template (``apply_chat_template(..., tools=...)``).
- Parsing: ``tokenizer.parse_response`` (transformers' response parser) with the tokenizer's own
  ``response_template`` when it has one, else :data:`HERMES_RESPONSE_TEMPLATE` (Qwen2.5 / Hermes
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, transformers' fallback for Qwen2).
- Faults never stop the run: a malformed call, an unknown tool, a tool that raises and a tool that
  runs past ``timeout_s`` each become a tool message the model sees (``"error: ..."``) and are
  counted (:meth:`ToolEnvironment.metrics`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..data.reward_set import CallExpired, call_with_timeout
from .environment import Environment, Messages, Step, Turn

#: transformers' response template for Qwen2 / Qwen3 models (``transformers/cli/serving/utils.py``), with a
#: ``<think>`` block parsed into ``reasoning_content`` (the key Qwen3's chat template renders back), so the answer an
#: environment scores is the content after it: Qwen3's template trains a final answer as
#: ``<think>\n\n</think>\n\n7<|im_end|>``.
HERMES_RESPONSE_TEMPLATE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "reasoning_content": {"open": "<think>", "close": "</think>", "content": "text"},
        "tool_calls": {
            "open_pattern": r"\s*<tool_call>",
            "close": "</tool_call>",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"\s*(?:<\|im_end\|>|<\|endoftext\|>|<\|eot_id\|>)", "content": "text"},
    },
}

#: Metric names counted per episode (averaged over episodes in the logs).
TOOL_COUNTERS = ("tool_calls", "tool_errors", "tool_timeouts", "malformed_calls", "unknown_tools")


def tool_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The JSON schema of a tool function, from its signature and docstring (transformers)."""
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(fn)
    except Exception as err:  # transformers raises its own DocstringParsingException / TypeHintParsingException
        name = getattr(fn, "__name__", repr(fn))  # a user's tool function
        raise ValueError(f"tool {name!r}: cannot build its JSON schema ({type(err).__name__}: {err})") from err


def parse_tool_calls(tokenizer: Any, text: str) -> tuple[dict[str, Any], str | None]:
    """(assistant message, None) or (a content-only message, error) when a call is malformed.

    The message holds ``content`` and ``tool_calls`` = ``[{"type": "function", "function":
    {"name": str, "arguments": dict}}]`` in the chat-template format.
    """
    # a transformers tokenizer (third-party)
    schema = getattr(tokenizer, "response_template", None) or HERMES_RESPONSE_TEMPLATE
    try:
        message = tokenizer.parse_response(text, schema=schema, prefix="")
    except ValueError as err:
        return {"role": "assistant", "content": text}, f"malformed tool call: {str(err).splitlines()[0]}"
    for call in message.get("tool_calls") or []:
        fn = call.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            return {
                "role": "assistant",
                "content": text,
            }, f'malformed tool call: expected {{"name": ..., "arguments": {{...}}}}, got {json.dumps(fn)[:80]}'
        if not isinstance(fn.setdefault("arguments", {}), dict):
            return {
                "role": "assistant",
                "content": text,
            }, f"malformed tool call: arguments of {fn['name']!r} must be an object"
    message.setdefault("content", "")
    return message, None


class ToolEnvironment(Environment):
    """An environment whose model turns may call tools; a turn without a call ends the episode.

    Subclasses set :attr:`tools` (or pass ``tools=``), build the opening in :meth:`reset` and
    score the final answer in :meth:`answer`.

    Args:
        tools: functions the model may call (default: the class attribute ``tools``).
        timeout_s: seconds one tool call may run before it becomes a timeout error message.
        tools_enabled: False executes nothing: every call is answered as an unknown tool (a control).
    """

    def __init__(
        self, tools: list[Callable[..., Any]] | None = None, timeout_s: float | None = 10.0, tools_enabled: bool = True
    ) -> None:
        self.tools = list(self.tools if tools is None else tools) if tools_enabled else []
        self.timeout_s = timeout_s
        self._by_name = {fn.__name__: fn for fn in self.tools}
        self.counts = dict.fromkeys(TOOL_COUNTERS, 0)
        self.tokenizer: Any = None  # set by the episode runner before reset

    def answer(self, message: dict[str, Any], turn: Turn) -> float:
        """Reward of the final answer (a turn without tool calls); default 0."""
        return 0.0

    def step(self, turn: Turn) -> Step:
        message, error = parse_tool_calls(self.tokenizer, turn.text)
        if error is not None:
            self.counts["malformed_calls"] += 1
            return Step([{"role": "tool", "content": f"error: {error}"}], assistant=message)
        calls = message.get("tool_calls") or []
        if not calls:
            return Step(reward=float(self.answer(message, turn)), done=True, assistant=message)
        return Step([self.run_call(call["function"]) for call in calls], assistant=message)

    def run_call(self, fn_call: dict[str, Any]) -> dict[str, Any]:
        """Execute one parsed call; the result (or the error) as a tool message."""
        name, args = fn_call["name"], fn_call["arguments"]
        self.counts["tool_calls"] += 1
        fn = self._by_name.get(name)
        if fn is None:
            self.counts["unknown_tools"] += 1
            known = ", ".join(self._by_name) or "none"
            return _tool_message(name, f"error: unknown tool {name!r} (available: {known})")
        try:
            result = call_with_timeout(fn, self.timeout_s, (), args, name="tool-call")
        except CallExpired:
            self.counts["tool_timeouts"] += 1
            return _tool_message(name, f"error: tool {name!r} timed out after {self.timeout_s} s")
        except Exception as err:  # noqa: BLE001 - the model sees the error, the run goes on
            self.counts["tool_errors"] += 1
            return _tool_message(name, f"error: tool {name!r} raised {type(err).__name__}: {err}")
        return _tool_message(name, result if isinstance(result, str) else json.dumps(result, default=str))

    def metrics(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.counts.items()}


def _tool_message(name: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "name": name, "content": content}


def tool_messages(messages: Messages) -> list[str]:
    """Contents of the tool messages of a transcript (for reward functions)."""
    return [m["content"] for m in messages if m.get("role") == "tool"]
