"""From raw rows to prompt records: the mapping hook, column checks, chat template, tokenization.

A record is a dict holding every column of its row (after ``data.record_map``), plus

* ``"prompt"``: the text actually fed to the policy (after the chat template, and truncation);
* ``"prompt_ids"``: its token ids (``list[int]``);
* ``"raw_prompt"``: the prompt column's value as the data holds it (text, or chat messages),
  before the chat template: what TRL-style reward functions receive as ``prompts``;
* ``"answer"``: a copy of ``answer_column`` (when set).

Reward functions receive every key of the record as a column of the same name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from lightning.pytorch.utilities import rank_zero_warn

from lightning_grpo.core.resolve import resolve_callable

#: Record key of the prompt column's value before the chat template (text or messages).
RAW_PROMPT = "raw_prompt"


def dataset_row(record: dict[str, Any]) -> dict[str, Any]:
    """The row as the dataset holds it (what TRL passes on): the record without ``prompt_ids`` and
    ``raw_prompt``, and ``"prompt"`` back to the prompt before the chat template."""
    row = {k: v for k, v in record.items() if k not in ("prompt_ids", RAW_PROMPT)}
    if RAW_PROMPT in record:
        row["prompt"] = record[RAW_PROMPT]
    return row

RecordMap = Callable[[dict[str, Any]], dict[str, Any]]


def is_chat(value: Any) -> bool:
    """Chat messages: a list of dicts (``{"role": ..., "content": ...}``)."""
    return isinstance(value, list) and all(isinstance(m, dict) for m in value)


# ------------------------------------------------------------------------------- mapping hook
def resolve_record_map(record_map: str | RecordMap | None) -> tuple[RecordMap, str] | None:
    """(the function, its name in errors) for ``data.record_map``: an import path
    ``"pkg.mod.fn"`` / ``"pkg.mod:fn"`` or the function itself."""
    if record_map is None:
        return None
    fn = resolve_callable(record_map, None, "data.record_map", "my_module.map_row")
    name = record_map if isinstance(record_map, str) else getattr(fn, "__qualname__", repr(fn))
    return fn, name


def apply_record_map(record_map: tuple[RecordMap, str] | None, rows: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
    """``fn(row)`` for every row (each gets a copy); one clear error naming the function and the row."""
    if record_map is None:
        return rows
    fn, name = record_map
    out = []
    for i, row in enumerate(rows):
        try:
            mapped = fn(dict(row))
        except Exception as err:
            raise ValueError(f"data.record_map {name} raised {type(err).__name__}: {err} on row {i} of {source}") from err
        if not isinstance(mapped, dict):
            raise TypeError(
                f"data.record_map {name} returned a {type(mapped).__name__} for row {i} of {source}; "
                "expected a dict (the row's columns)"
            )
        out.append(mapped)
    return out


# ------------------------------------------------------------------------------- tokenizer
def check_tokenizer(tokenizer: Any, where: str, use_chat_template: bool) -> None:
    """An EOS token (completions must be able to end), a pad token (the EOS one when it has none),
    and a chat template when ``use_chat_template`` asks for one."""
    if getattr(tokenizer, "eos_token_id", None) is None:
        raise ValueError(
            f"the tokenizer at {where} (data.tokenizer_path) has no EOS token, so no completion could end: "
            "use the policy's own tokenizer, or set its eos_token"
        )
    if getattr(tokenizer, "pad_token_id", None) is None:
        tokenizer.pad_token = tokenizer.eos_token  # padding is masked out everywhere
    if use_chat_template and not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"use_chat_template=True but the tokenizer at {where} has no chat template: set "
            "data.use_chat_template: false to feed the prompts as plain text, or point data.tokenizer_path "
            "at a tokenizer that has one (an instruct / chat model's)"
        )


def check_template_kwargs(kwargs: Any, use_chat_template: bool) -> None:
    """``chat_template_kwargs`` is None or a mapping of names, and only given with the chat template."""
    if kwargs is None:
        return
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise ValueError(f"chat_template_kwargs must be a mapping of argument names to values, got {kwargs!r}")
    if not use_chat_template:
        raise ValueError("chat_template_kwargs needs use_chat_template=True")


# ------------------------------------------------------------------------------- records
@dataclass
class RecordFormat:
    """How rows become records (the options of the same name of ``PromptDataModule``)."""

    prompt_column: str = "prompt"
    answer_column: str | None = "answer"
    use_chat_template: bool = False
    system_prompt: str | None = None
    max_prompt_length: int | None = None
    on_long_prompt: Literal["error", "truncate"] = "error"
    chat_template_kwargs: dict[str, Any] | None = None
    warned_truncation: bool = field(default=False, init=False)

    def check_columns(self, rows: list[dict[str, Any]], source: str) -> None:
        """The rows exist and hold the prompt (and answer) column."""
        if not rows:
            raise ValueError(f"{source} holds no rows")
        present = list(rows[0])
        if self.prompt_column not in present:
            raise ValueError(f"prompt_column {self.prompt_column!r} not found in {source}; columns present: {present}")
        if self.answer_column is not None and self.answer_column not in present:
            raise ValueError(
                f"answer_column {self.answer_column!r} not found in {source}; columns present: {present} "
                "(set answer_column=None for data without answers)"
            )

    def render(self, prompt: Any, tokenizer: Any, source: str, index: int) -> str:
        """The text fed to the policy for one prompt value (text, or chat messages)."""
        chat = is_chat(prompt)
        if not isinstance(prompt, str) and not chat:
            raise ValueError(
                f"prompt_column {self.prompt_column!r} of {source} must hold strings or chat messages; "
                f"row {index} holds a {type(prompt).__name__}"
            )
        if not self.use_chat_template:
            if chat:
                raise ValueError(
                    f"prompt_column {self.prompt_column!r} of {source} holds chat messages; set use_chat_template=True"
                )
            return prompt
        messages = list(prompt) if chat else [{"role": "user", "content": prompt}]
        if self.system_prompt is not None and not (messages and messages[0].get("role") == "system"):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        kwargs = self.chat_template_kwargs or {}
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)

    def build(self, rows: list[dict[str, Any]], source: str, tokenizer: Any) -> list[dict[str, Any]]:
        """Records of ``rows`` (see the module docstring), whose columns :meth:`check_columns` accepted."""
        texts = [self.render(row[self.prompt_column], tokenizer, source, i) for i, row in enumerate(rows)]
        # A chat template writes its own special tokens (e.g. BOS); plain text gets the tokenizer's.
        all_ids = tokenizer(texts, add_special_tokens=not self.use_chat_template)["input_ids"]
        limit, truncated = self.max_prompt_length, 0
        records = []
        for i, (row, text, ids) in enumerate(zip(rows, texts, all_ids)):
            if limit is not None and len(ids) > limit:
                if self.on_long_prompt == "error":
                    raise ValueError(
                        f"prompt {i} of {source} has {len(ids)} tokens, more than max_prompt_length={limit} "
                        f"(set on_long_prompt='truncate' to keep its last {limit} tokens)"
                    )
                ids, truncated = ids[-limit:], truncated + 1
                text = tokenizer.decode(ids, skip_special_tokens=False)
            record = {**row, RAW_PROMPT: row[self.prompt_column], "prompt": text, "prompt_ids": list(ids)}
            if self.answer_column is not None:
                record["answer"] = row[self.answer_column]
            records.append(record)
        if truncated and not self.warned_truncation:
            self.warned_truncation = True
            rank_zero_warn(
                f"truncated {truncated} of {len(rows)} prompts of {source} to their last {limit} tokens "
                "(max_prompt_length); further truncations are not reported"
            )
        return records
