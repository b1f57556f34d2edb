"""Rendering episode turns with the tokenizer's chat template, new messages only.

Token-in-token-out: the model's sampled ids go into the trajectory as they are; only the
messages the environment adds are rendered and tokenised. The text of the new messages is the
difference between the template's rendering of the conversation with and without them
(``apply_chat_template(history + new) - apply_chat_template(history)``; for templates that render
a final assistant message differently, such as Qwen3's, what follows the model's message in the
new rendering: :meth:`ChatRenderer.new_text`), prefixed with what the template writes after an
assistant message that the model did not sample itself (e.g. the ``<|im_end|>\\n`` after a turn
that stopped at ``</tool_call>``, or the ``\\n`` after ``<|im_end|>``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..data.records import is_chat
from .environment import Messages

_PROBE = "\x00probe\x00"
#: The reasoning block of :func:`probe_episode`'s assistant turns (a template that drops reasoning drops it).
_THOUGHT = "<think>\nFirst step.\n</think>\n\n"


def probe_episode(prompt: Any, tools: list[dict] | None = None) -> Messages:
    """A made-up episode for the chat-template check (:mod:`lightning_grpo.data.chat_prefix`): ``prompt`` (text, as
    a user message, or chat messages) opens it; an assistant turn with a ``<think>`` block, the environment's
    answer (a tool result after a call of the first tool when there are ``tools``, else a user message) and a last
    assistant turn follow."""
    opening = list(prompt) if is_chat(prompt) else [{"role": "user", "content": str(prompt)}]
    if tools:
        call = {"type": "function", "function": {"name": tools[0]["function"]["name"], "arguments": {}}}
        turn = {"role": "assistant", "content": _THOUGHT, "tool_calls": [call]}
        answer = {"role": "tool", "content": "1"}
    else:
        turn, answer = (
            {"role": "assistant", "content": _THOUGHT + "A first answer."},
            {"role": "user", "content": "Go on."},
        )
    return [*opening, turn, answer, {"role": "assistant", "content": _THOUGHT + "Done."}]


class ChatRenderer:
    """Tokenises episode openings and environment turns with ``tokenizer``'s chat template.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        tools: functions (their schemas: :func:`~lightning_grpo.agents.tools.tool_schema`) or JSON
            schemas, passed to ``apply_chat_template(..., tools=...)``.
    """

    def __init__(self, tokenizer: Any, tools: list[Callable | dict] | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):  # a transformers tokenizer (third-party)
            raise ValueError(
                "multi-turn chat episodes need a tokenizer with a chat template "
                f"({type(tokenizer).__name__} has none); return None from Environment.reset to use plain-text prompts"
            )
        from .tools import tool_schema

        self.tokenizer = tokenizer
        # schemas built here, so a tool without type hints / docstring fails before any episode
        self.tools = [t if isinstance(t, dict) else tool_schema(t) for t in tools] if tools else None
        self.end_of_turn = self._assistant_suffix()

    def render(self, messages: Messages, add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=self.tools, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (templates write their own special tokens: none added)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_ids(self, messages: Messages) -> list[int]:
        """The opening of an episode, ending with the generation prompt."""
        return self.encode(self.render(messages, add_generation_prompt=True))

    def _assistant_suffix(self) -> str:
        """What the template writes after an assistant message's content (``<|im_end|>\\n`` for ChatML)."""
        convo = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _PROBE}]
        text = self.tokenizer.apply_chat_template(convo, tokenize=False)
        return text[text.rindex(_PROBE) + len(_PROBE) :]

    def observation_ids(self, history: Messages, new: Messages, sampled_text: str) -> list[int]:
        """Token ids that follow a model turn: the rest of the assistant message the model did not
        sample, then ``new`` rendered, ending with the next generation prompt.

        ``history`` ends with the model's turn as a message; ``sampled_text`` is that turn's decoded
        ids (special tokens kept).
        """
        return self.encode(self.glue(sampled_text) + self.new_text(history, new))

    def new_text(self, history: Messages, new: Messages) -> str:
        """The template's text of ``new`` and the next generation prompt after ``history`` (which ends
        with the model's message).

        Usually ``render(history + new) - render(history)``. Some templates render a final assistant
        message differently from one that other messages follow (Qwen3 writes an empty
        ``<think>\\n\\n</think>\\n\\n`` block into the final one only): then the new text is what follows
        the end-of-turn after the model's message, found by a probe appended to that message's content.
        """
        after = self.render(history + new, add_generation_prompt=True)
        before = self.render(history, add_generation_prompt=False)
        if after.startswith(before):
            return after[len(before) :]
        last = {**history[-1], "content": (history[-1].get("content") or "") + _PROBE}
        probed = self.render(history[:-1] + [last] + new, add_generation_prompt=True)
        at = probed.find(_PROBE)
        end = probed.find(self.end_of_turn, at + len(_PROBE)) if at >= 0 else -1
        tail = probed[end + len(self.end_of_turn) :] if end >= 0 else None
        if tail is None or _PROBE in tail or not after.endswith(tail):
            k = next((i for i, (a, b) in enumerate(zip(before, after)) if a != b), min(len(before), len(after)))
            raise ValueError(
                "the chat template renders the conversation differently once new messages follow it, and the end of "
                f"the model's message cannot be found in the new rendering ({self.end_of_turn!r} after its content), so "
                f"the new messages cannot be tokenised on their own; first difference at character {k}: "
                f"{before[k : k + 60]!r} vs {after[k : k + 60]!r}"
            )
        return tail

    def glue(self, sampled_text: str) -> str:
        """The part of the template's end-of-turn text that the sampled turn did not already end with."""
        suffix = self.end_of_turn
        for k in range(len(suffix), 0, -1):
            if sampled_text.endswith(suffix[:k]):
                return suffix[k:]
        return suffix
