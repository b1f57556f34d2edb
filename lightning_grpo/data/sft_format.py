"""Supervised examples: rows become token ids and an assistant-only loss mask.

A row is either

* ``prompt`` + ``answer`` (the columns of ``data.format``, :class:`~lightning_grpo.data.records.PromptFormat`):
  without the chat template the prompt is tokenized exactly as GRPO tokenizes it and the answer
  follows, then EOS; with it, the prompt is the user turn (after ``system_prompt``; a prompt that holds
  chat messages is kept as they are) and the answer the assistant turn; or
* ``messages``: a whole chat transcript (system, user, assistant turns with ``tool_calls``, ``tool``
  results), with an optional ``tools`` column handed to the chat template.

The loss mask marks exactly the assistant turns' tokens, found without ``{% generation %}`` support in
the template (Qwen3's has none): the transcript is rendered once whole, and for each assistant turn k
the prefix ``messages[:k]`` is rendered with the generation prompt (the turn starts where it ends) and
``messages[:k+1]`` without (the turn ends there). Each prefix must be a prefix of the whole render's token
ids; a turn rendered with extra tokens only while it is the last one (Qwen3's empty ``<think>`` block) is
matched by its remaining tokens. Any other difference is an error naming the row. The mask covers the
turn's content, tool-call text and closing token (``<|im_end|>``), not the generation prompt
(``<|im_start|>assistant\\n``) nor whitespace after the closing token.

``last_turn_weight`` (default 1) is the loss weight of the last assistant turn's tokens, the others
weighing 1: the loss is the weighted token mean, so a transcript whose final answer is one token among
twenty of tool-call text can have that answer count (ms-swift's ``loss_scale``; ``last_turn_weight``
large approaches LLaMA-Factory's ``mask_history``, which trains on the last turn alone).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .columns import column_fix
from .records import is_chat

#: Keys of an SFT example.
INPUT_IDS, LOSS_MASK = "input_ids", "loss_mask"


@dataclass
class SFTFormat:
    """How rows become supervised examples (the fields of ``SFTDataModule``'s ``data.format``, ``SFTFormatSettings``)."""

    prompt_column: str = "prompt"
    answer_column: str = "answer"
    messages_column: str = "messages"
    tools_column: str = "tools"
    use_chat_template: bool = False
    system_prompt: str | None = None
    max_length: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    last_turn_weight: float = 1.0

    def __post_init__(self) -> None:
        weight = self.last_turn_weight
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0 or weight == float("inf"):
            raise ValueError(
                f"data.format.last_turn_weight must be a finite number > 0 (the last assistant turn's loss weight), got {weight!r}"
            )

    def kind(self, rows: list[dict[str, Any]], source: str) -> str:
        """ "messages" or "prompt_answer": which columns the rows hold (one clear error when neither)."""
        if not rows:
            raise ValueError(f"{source} holds no rows")
        present = list(rows[0])
        if self.messages_column in present:
            if not self.use_chat_template:
                raise ValueError(
                    f"data.format.messages_column {self.messages_column!r} of {source} holds chat transcripts; set data.format.use_chat_template: true"
                )
            return "messages"
        missing = [c for c in (self.prompt_column, self.answer_column) if c not in present]
        if missing:
            fixes = [
                column_fix(f"{kind}_column", kind, rows, exclude=(other,))
                for kind, column, other in (
                    ("prompt", self.prompt_column, self.answer_column),
                    ("answer", self.answer_column, self.prompt_column),
                )
                if column in missing
            ]
            raise ValueError(
                f"{source} has neither a data.format.messages_column {self.messages_column!r} (chat transcripts) nor the "
                f"data.format.prompt_column {self.prompt_column!r} and data.format.answer_column {self.answer_column!r} (missing {missing}); "
                f"columns present: {present}; {'; '.join(fixes)}"
            )
        return "prompt_answer"

    def check_columns(self, rows: list[dict[str, Any]], source: str) -> None:
        self.kind(rows, source)

    def build(self, rows: list[dict[str, Any]], source: str, tokenizer: Any) -> list[dict[str, Any]]:
        """Examples ``{"input_ids": list[int], "loss_mask": list[int], **row}`` of ``rows``."""
        kind = self.kind(rows, source)
        examples = []
        for i, row in enumerate(rows):
            where = f"row {i} of {source}"
            if kind == "messages":
                ids, mask = assistant_mask(
                    row[self.messages_column],
                    tokenizer,
                    where,
                    row.get(self.tools_column),
                    self.chat_template_kwargs,
                    self.last_turn_weight,
                )
            elif self.use_chat_template:
                ids, mask = assistant_mask(
                    self._as_messages(row, where),
                    tokenizer,
                    where,
                    None,
                    self.chat_template_kwargs,
                    self.last_turn_weight,
                )
            else:
                ids, mask = self._plain(row, tokenizer, where)
            if not any(mask):
                raise ValueError(f"{where} has no assistant tokens to train on (an empty answer, or no assistant turn)")
            if self.max_length is not None and len(ids) > self.max_length:
                raise ValueError(f"{where} has {len(ids)} tokens, more than data.format.max_length={self.max_length}")
            examples.append({**row, INPUT_IDS: ids, LOSS_MASK: mask})
        return examples

    def conversations(self, rows: list[dict[str, Any]], source: str) -> list[tuple[list[dict[str, Any]], Any, str]]:
        """(messages, tools, "row i of ``source``") of the rows as :meth:`build` renders them; none for rows without
        the chat template (nothing is rendered by turns)."""
        if not rows or not self.use_chat_template:
            return []
        if self.kind(rows, source) == "messages":
            return [
                (row[self.messages_column], row.get(self.tools_column), f"row {i} of {source}")
                for i, row in enumerate(rows)
            ]
        return [
            (self._as_messages(row, f"row {i} of {source}"), None, f"row {i} of {source}") for i, row in enumerate(rows)
        ]

    def _as_messages(self, row: dict[str, Any], where: str) -> list[dict[str, Any]]:
        prompt, answer = row[self.prompt_column], _text(row[self.answer_column], self.answer_column, where)
        if not isinstance(prompt, str) and not is_chat(prompt):
            raise ValueError(
                f"data.format.prompt_column {self.prompt_column!r} of {where} must hold a string or chat messages, got {type(prompt).__name__}"
            )
        messages = list(prompt) if is_chat(prompt) else [{"role": "user", "content": prompt}]
        if self.system_prompt is not None and messages[0].get("role") != "system":
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages + [{"role": "assistant", "content": answer}]

    def _plain(self, row: dict[str, Any], tokenizer: Any, where: str) -> tuple[list[int], list[int]]:
        """Prompt ids as PromptDataModule makes them (the tokenizer's special tokens), then answer + EOS."""
        prompt = _text(row[self.prompt_column], self.prompt_column, where)
        answer = _text(row[self.answer_column], self.answer_column, where)
        prompt_ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
        answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        return prompt_ids + answer_ids, [0] * len(prompt_ids) + [1] * len(answer_ids)


def _text(value: Any, column: str, where: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"column {column!r} of {where} must hold a string, got {type(value).__name__}")
    return value


def render_ids(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: Any,
    generation_prompt: bool,
    template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """Token ids of the chat template's rendering (the template writes its own special tokens)."""
    text = tokenizer.apply_chat_template(
        messages,
        tools=tools or None,
        tokenize=False,
        add_generation_prompt=generation_prompt,
        **(template_kwargs or {}),
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def assistant_mask(
    messages: Any,
    tokenizer: Any,
    where: str,
    tools: Any = None,
    template_kwargs: dict[str, Any] | None = None,
    last_turn_weight: float = 1.0,
) -> tuple[list[int], list[float]]:
    """(token ids of the whole transcript, the loss weight of each token: 1 on its assistant turns' tokens,
    ``last_turn_weight`` on the last assistant turn's, 0 elsewhere); see the module docstring."""
    if not is_chat(messages) or not messages:
        raise ValueError(
            f"{where}: the transcript must be a non-empty list of chat messages, got {type(messages).__name__}"
        )
    turns = [k for k, m in enumerate(messages) if m.get("role") == "assistant"]
    if not turns:
        raise ValueError(f"{where} has no assistant turn to train on (roles: {[m.get('role') for m in messages]})")
    full = render_ids(tokenizer, messages, tools, False, template_kwargs)
    mask = [0] * len(full)
    for k in turns:
        start = render_ids(tokenizer, messages[:k], tools, True, template_kwargs)
        if full[: len(start)] != start:
            raise ValueError(_mismatch(where, k, "the conversation before it, with the generation prompt,"))
        end = _turn_end(full, len(start), render_ids(tokenizer, messages[: k + 1], tools, False, template_kwargs))
        if end is None:
            raise ValueError(_mismatch(where, k, "the conversation up to it"))
        while end > len(start) and not tokenizer.decode(full[end - 1 : end]).strip():
            end -= 1  # whitespace after the closing token is never sampled
        weight = last_turn_weight if k == turns[-1] else 1
        mask[len(start) : end] = [weight] * (end - len(start))
    return full, mask


def _turn_end(full: list[int], start: int, prefix: list[int]) -> int | None:
    """Where the turn rendered last in ``prefix`` ends in ``full``: ``len(prefix)`` when ``prefix`` is a
    prefix of ``full``; else, when ``prefix`` only adds tokens right after the turn's start (a template
    that writes something into the last turn alone), the end of the rest; else None."""
    if full[: len(prefix)] == prefix:
        return len(prefix)
    if prefix[:start] != full[:start]:
        return None
    for extra in range(1, len(prefix) - start + 1):
        rest = prefix[start + extra :]
        if rest and full[start : start + len(rest)] == rest:
            return start + len(rest)
    return None


def _mismatch(where: str, k: int, what: str) -> str:
    return (
        f"{where}: the chat template renders {what} (message {k}, an assistant turn) differently from the same "
        "part of the whole transcript, so the assistant tokens cannot be located (does the template rewrite "
        "earlier turns, e.g. drop their reasoning?): give the transcript in the form the template renders, or "
        "use a template whose renderings of a conversation's beginnings are prefixes of the whole"
    )
