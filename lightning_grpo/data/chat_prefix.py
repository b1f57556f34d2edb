"""Chat templates that rewrite earlier turns, found by rendering a conversation's growing prefixes.

Multi-turn training assumes that a conversation rendered with one more message starts with the rendering
of the conversation before it. Some templates break that: Qwen3's drops the ``<think>`` block of every
assistant turn before the last user message, so ``[user, assistant(<think>r</think>a)]`` renders the
reasoning and ``[user, assistant(...), user]`` does not. Whatever is trained on a rendering of the whole
conversation (an SFT transcript's loss mask) then sees other tokens than the model wrote at that turn.

:func:`first_break` renders ``messages[:1]``, ``messages[:2]``, ... and returns the first place where
``messages[:k+1]``'s token ids do not start with ``messages[:k]``'s (a :class:`PrefixBreak`: the message
appended, the message whose tokens changed, the first differing token). One difference is not counted: text a
template writes into an assistant message only while it is the last one, whatever its content (Qwen3's empty
``<think>\\n\\n</think>\\n\\n``, :func:`last_turn_extra`): that text follows the generation prompt, the model
never conditions on it as history, and :func:`~lightning_grpo.data.sft_format.assistant_mask` masks around it.
:func:`rewrite_warning` turns the first break among a few conversations into one line.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

#: Content no template writes itself, to find where a message's content lands in a rendering.
_PROBE = "\x00probe\x00"

#: (messages, tools or None, how the warning names the conversation).
Conversation = tuple[list[dict[str, Any]], Any, str]


@dataclass(frozen=True)
class PrefixBreak:
    """Where a conversation's rendering stops being a prefix of the rendering with one more message."""

    appended: int
    """Index of the message whose appending changed the earlier rendering."""
    changed: int
    """Index of the message that holds the first differing token (in the shorter rendering)."""
    position: int
    """Token index of the first difference."""
    before: str
    """That token in the rendering of ``messages[:appended]`` (text and id; "end" when it had ended)."""
    after: str
    """The token at the same index in the rendering of ``messages[:appended + 1]``."""


def _render_text(tokenizer: Any, messages: list[dict[str, Any]], tools: Any, kwargs: dict[str, Any] | None) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False, **(kwargs or {}))


def last_turn_extra(tokenizer: Any, template_kwargs: dict[str, Any] | None = None) -> str:
    """Text the template writes before an assistant message's content only while that message is the last one
    (Qwen3: ``<think>\\n\\n</think>\\n\\n``), found with a probe message; "" for none."""
    convo = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _PROBE}]
    last = _render_text(tokenizer, convo, None, template_kwargs)
    more = _render_text(tokenizer, [*convo, {"role": "user", "content": "y"}], None, template_kwargs)
    if _PROBE not in last or _PROBE not in more:
        return ""
    head, head_more = last[: last.index(_PROBE)], more[: more.index(_PROBE)]
    return head[len(head_more) :] if head != head_more and head.startswith(head_more) else ""


def first_break(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: Any = None,
    template_kwargs: dict[str, Any] | None = None,
    extra: str = "",
) -> PrefixBreak | None:
    """The first ``k`` where ``messages[:k+1]``'s rendering does not start with ``messages[:k]``'s (token ids),
    or None; ``extra``: the template's last-turn-only text (:func:`last_turn_extra`), not counted."""
    texts = [_render_text(tokenizer, messages[:j], tools, template_kwargs) for j in range(1, len(messages) + 1)]
    ids = [list(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts]  # specials: the template
    for k in range(1, len(messages)):  # append message k to messages[:k]
        short, long = ids[k - 1], ids[k]
        if long[: len(short)] == short:
            continue
        start = len(texts[k - 2]) if k >= 2 else 0  # where message k-1 begins in texts[k-1]
        if extra and messages[k - 1].get("role") == "assistant" and _only_extra(texts[k - 1], texts[k], extra, start):
            continue
        i = next((p for p, (a, b) in enumerate(zip(short, long)) if a != b), min(len(short), len(long)))
        changed = max(j for j in range(k) if j == 0 or len(ids[j - 1]) <= i)  # message j's tokens start there
        return PrefixBreak(k, changed, i, _token(tokenizer, short, i), _token(tokenizer, long, i))
    return None


def _only_extra(short: str, long: str, extra: str, start: int) -> bool:
    """``long`` starts with ``short`` less the last-turn-only ``extra`` written into its last message."""
    at = short.rfind(extra)
    return at >= start and long.startswith(short[:at] + short[at + len(extra) :])


def _token(tokenizer: Any, ids: list[int], i: int) -> str:
    return f"{tokenizer.decode(ids[i : i + 1])!r} (id {ids[i]})" if i < len(ids) else "the end"


def rewrite_warning(
    tokenizer: Any,
    conversations: Iterable[Conversation],
    consequence: str,
    template_kwargs: dict[str, Any] | None = None,
) -> str | None:
    """One line naming the first conversation whose rendering rewrites an earlier turn (the message, the first
    differing token, ``consequence``: what it means for this run), or None when every prefix holds.
    A conversation the template cannot render is left out (the data's own checks report it)."""
    conversations = list(conversations)
    if not conversations:
        return None
    try:
        extra = last_turn_extra(tokenizer, template_kwargs)
    except Exception:  # noqa: BLE001 - a template that refuses the probe: every difference counts
        extra = ""
    found, checked = [], 0
    for messages, tools, where in conversations:
        try:
            hit = first_break(tokenizer, messages, tools, template_kwargs, extra)
        except Exception:  # noqa: BLE001 - a template error (jinja's own types): not this check's to report
            continue
        checked += 1
        if hit is not None:
            found.append((messages, where, hit))
    if not found:
        return None
    messages, where, hit = found[0]
    role = messages[hit.changed].get("role")
    return (
        f"the chat template rewrites earlier turns: in {where}, appending message {hit.appended} "
        f"({messages[hit.appended].get('role')}) changes how message {hit.changed} ({role}) renders: token "
        f"{hit.position} {hit.before} becomes {hit.after} ({len(found)} of {checked} conversations checked). "
        f"{consequence} (docs/guide/troubleshooting.md#the-chat-template-rewrites-earlier-turns)"
    )
