"""From raw rows to prompt records: the mapping hook, column checks, chat template, tokenization.

A record is a dict holding every column of its row (after ``data.format.record_map``), plus

* ``"prompt"``: the text actually fed to the policy (after the chat template, and truncation);
* ``"prompt_ids"``: its token ids (``list[int]``);
* ``"raw_prompt"``: the prompt column's value as the data holds it (text, or chat messages),
  before the chat template: what TRL-style reward functions receive as ``prompts``;
* ``"answer"``: ``data.format.answer_column``'s value as text (when set; `answer_text`: a number as it is
  written, ``8`` -> ``"8"``; ``None`` for a missing one); the column itself keeps the data's value.

Reward functions receive every key of the record as a column of the same name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from lightning.pytorch.utilities import rank_zero_warn

from lightning_grpo.core.resolve import resolve_callable

from .columns import answer_text, check_answers, column_fix

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
    """(the function, its name in errors) for ``data.format.record_map``: an import path
    ``"pkg.mod.fn"`` / ``"pkg.mod:fn"`` or the function itself."""
    if record_map is None:
        return None
    fn = resolve_callable(record_map, None, "data.format.record_map", "my_module.map_row")
    # a user's record_map function
    name = record_map if isinstance(record_map, str) else getattr(fn, "__qualname__", repr(fn))
    return fn, name


def apply_record_map(
    record_map: tuple[RecordMap, str] | None, rows: list[dict[str, Any]], source: str
) -> list[dict[str, Any]]:
    """``fn(row)`` for every row (each gets a copy); one clear error naming the function and the row."""
    if record_map is None:
        return rows
    fn, name = record_map
    out = []
    for i, row in enumerate(rows):
        try:
            mapped = fn(dict(row))
        except Exception as err:
            raise ValueError(
                f"data.format.record_map {name} raised {type(err).__name__}: {err} on row {i} of {source}"
            ) from err
        if not isinstance(mapped, dict):
            raise TypeError(
                f"data.format.record_map {name} returned a {type(mapped).__name__} for row {i} of {source}; "
                "expected a dict (the row's columns)"
            )
        out.append(mapped)
    return out


# ------------------------------------------------------------------------------- tokenizer
def check_tokenizer(tokenizer: Any, where: str, use_chat_template: bool) -> None:
    """An EOS token (completions must be able to end), a pad token (the EOS one when it has none),
    and a chat template when ``use_chat_template`` asks for one."""
    if getattr(tokenizer, "eos_token_id", None) is None:  # a transformers tokenizer (third-party)
        raise ValueError(
            f"the tokenizer at {where} (data.tokenizer_path) has no EOS token, so no completion could end: "
            "use the policy's own tokenizer, or set its eos_token"
        )
    if getattr(tokenizer, "pad_token_id", None) is None:  # a transformers tokenizer (third-party)
        tokenizer.pad_token = tokenizer.eos_token  # padding is masked out everywhere
    if use_chat_template and not getattr(tokenizer, "chat_template", None):  # a transformers tokenizer (third-party)
        raise ValueError(
            f"data.format.use_chat_template is true but the tokenizer at {where} has no chat template: set "
            "data.format.use_chat_template: false to feed the prompts as plain text, or point data.tokenizer_path "
            "at a tokenizer that has one (an instruct / chat model's)"
        )


def check_template_kwargs(kwargs: Any, use_chat_template: bool) -> None:
    """``chat_template_kwargs`` is None or a mapping of names, and only given with the chat template."""
    if kwargs is None:
        return
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise ValueError(
            f"data.format.chat_template_kwargs must be a mapping of argument names to values, got {kwargs!r}"
        )
    if not use_chat_template:
        raise ValueError("data.format.chat_template_kwargs needs data.format.use_chat_template: true")


# ------------------------------------------------------------------------------- records
def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclass
class RowFormat:
    """How rows become model inputs: the columns, the mapping hook and the chat template. `PromptFormat` (RL
    prompts) adds a prompt length limit, `lightning_grpo.SFTFormatSettings` (SFT examples) transcripts and an
    example length limit."""

    prompt_column: str = "prompt"
    """Column holding the prompt: a string, or a list of chat messages when ``use_chat_template`` is true."""
    answer_column: str | None = "answer"
    """Column copied to each record's ``"answer"`` as text (numbers as written: ``8`` -> ``"8"``; null stays
    ``None``; a list or dict is refused), read by ``exact_match``, ``math_accuracy``; SFT's target. ``None``
    for data without answers."""
    use_chat_template: bool = False
    """Wrap each prompt as a user message and apply the tokenizer's chat template (with the generation
    prompt); false feeds the text as it is."""
    system_prompt: str | None = None
    """System message put before each prompt that has none (needs ``use_chat_template``)."""
    chat_template_kwargs: dict[str, Any] | None = None
    """Extra keyword arguments of the chat template (needs ``use_chat_template``), e.g.
    ``{enable_thinking: false}`` for Qwen3, whose prompt then ends in an empty ``<think>`` block (TRL's
    ``chat_template_kwargs``)."""
    record_map: str | RecordMap | None = None
    """Import path (``"my_module.fn"`` or ``"my_module:fn"``; the current directory is importable from
    ``lightning-grpo``) or, from Python, the function itself: ``fn(row) -> row`` applied to every raw row of
    every split before the columns are checked (to rename, add or derive columns; every column reaches the
    reward functions by name)."""
    template_check_rows: int = 4
    """Rows (SFT transcripts; the prompts an agent run's episodes open with) whose conversations are rendered
    message by message before the run, to warn when the chat template rewrites earlier turns (e.g. drops their
    ``<think>`` blocks; docs/guide/troubleshooting.md); 0 skips the check."""

    def __post_init__(self) -> None:
        for name in ("prompt_column", "answer_column"):
            value = getattr(self, name)
            if not (isinstance(value, str) and value) and not (name == "answer_column" and value is None):
                raise ValueError(f"data.format.{name} must name a column, got {value!r}")
        if not isinstance(self.use_chat_template, bool):
            raise ValueError(f"data.format.use_chat_template must be true or false, got {self.use_chat_template!r}")
        if self.system_prompt is not None and not self.use_chat_template:
            raise ValueError("data.format.system_prompt needs data.format.use_chat_template: true")
        check_template_kwargs(self.chat_template_kwargs, self.use_chat_template)
        resolve_record_map(self.record_map)  # an import path that does not resolve fails here
        rows = self.template_check_rows
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
            raise ValueError(f"data.format.template_check_rows must be an integer >= 0, got {rows!r}")


@dataclass
class PromptFormat(RowFormat):
    """How rows become prompts (``data.format``): the columns, the mapping hook, the chat template (`RowFormat`'s
    fields) and the length limit. Every field is checked here, so a bad value fails before any data is read."""

    max_prompt_length: int | None = None
    """Longest prompt in tokens; ``None`` for no limit."""
    on_long_prompt: Literal["error", "truncate"] = "error"
    """``"error"`` on a prompt over ``max_prompt_length``, or ``"truncate"`` it to its last
    ``max_prompt_length`` tokens (warns once)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_prompt_length is not None and not _positive_int(self.max_prompt_length):
            raise ValueError(
                f"data.format.max_prompt_length must be a positive integer or null, got {self.max_prompt_length!r}"
            )
        if self.on_long_prompt not in ("error", "truncate"):
            raise ValueError(f"data.format.on_long_prompt must be 'error' or 'truncate', got {self.on_long_prompt!r}")

    def check_columns(self, rows: list[dict[str, Any]], source: str) -> None:
        """The rows exist and hold the prompt (and answer) column; every answer has a text (no list or dict)."""
        if not rows:
            raise ValueError(f"{source} holds no rows")
        present = list(rows[0])
        if self.prompt_column not in present:
            fix = column_fix("prompt_column", "prompt", rows, exclude=(self.answer_column,))
            raise ValueError(
                f"data.format.prompt_column {self.prompt_column!r} not found in {source}; columns present: {present}; {fix}"
            )
        if self.answer_column is None:
            return
        if self.answer_column not in present:
            fix = column_fix("answer_column", "answer", rows, exclude=(self.prompt_column,))
            raise ValueError(
                f"data.format.answer_column {self.answer_column!r} not found in {source}; columns present: {present}; "
                f"{fix} (or null for data without answers)"
            )
        check_answers(rows, self.answer_column, source)

    def render(self, prompt: Any, tokenizer: Any, source: str, index: int) -> str:
        """The text fed to the policy for one prompt value (text, or chat messages)."""
        chat = is_chat(prompt)
        if not isinstance(prompt, str) and not chat:
            raise ValueError(
                f"data.format.prompt_column {self.prompt_column!r} of {source} must hold strings or chat messages; "
                f"row {index} holds a {type(prompt).__name__}"
            )
        if not self.use_chat_template:
            if chat:
                raise ValueError(
                    f"data.format.prompt_column {self.prompt_column!r} of {source} holds chat messages; "
                    "set data.format.use_chat_template: true"
                )
            return prompt
        messages = list(prompt) if chat else [{"role": "user", "content": prompt}]
        if self.system_prompt is not None and not (messages and messages[0].get("role") == "system"):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        kwargs = self.chat_template_kwargs or {}
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)


class RecordBuilder:
    """Prompt records of rows in a `PromptFormat` (one per data module: it warns about
    truncated prompts once)."""

    def __init__(self, format: PromptFormat) -> None:
        self.format = format
        self._warned_truncation = False
        self._warned_characters = False

    def check_columns(self, rows: list[dict[str, Any]], source: str) -> None:
        self.format.check_columns(rows, source)

    def build(self, rows: list[dict[str, Any]], source: str, tokenizer: Any) -> list[dict[str, Any]]:
        """Records of ``rows`` (see the module docstring), whose columns `check_columns` accepted."""
        fmt = self.format
        self._check_characters(rows, source, tokenizer)
        texts = [fmt.render(row[fmt.prompt_column], tokenizer, source, i) for i, row in enumerate(rows)]
        # A chat template writes its own special tokens (e.g. BOS); plain text gets the tokenizer's.
        all_ids = tokenizer(texts, add_special_tokens=not fmt.use_chat_template)["input_ids"]
        limit, truncated = fmt.max_prompt_length, 0
        records = []
        for i, (row, text, ids) in enumerate(zip(rows, texts, all_ids)):
            if limit is not None and len(ids) > limit:
                if fmt.on_long_prompt == "error":
                    raise ValueError(
                        f"prompt {i} of {source} has {len(ids)} tokens, more than data.format.max_prompt_length={limit} "
                        f"(set data.format.on_long_prompt: truncate to keep its last {limit} tokens)"
                    )
                ids, truncated = ids[-limit:], truncated + 1
                text = tokenizer.decode(ids, skip_special_tokens=False)
            record = {**row, RAW_PROMPT: row[fmt.prompt_column], "prompt": text, "prompt_ids": list(ids)}
            if fmt.answer_column is not None:
                record["answer"] = answer_text(row[fmt.answer_column])
            records.append(record)
        if truncated and not self._warned_truncation:
            self._warned_truncation = True
            rank_zero_warn(
                f"truncated {truncated} of {len(rows)} prompts of {source} to their last {limit} tokens "
                "(data.format.max_prompt_length); further truncations are not reported"
            )
        return records

    def _check_characters(self, rows: list[dict[str, Any]], source: str, tokenizer: Any) -> None:
        """Warn once when the prompts or answers hold characters the tokenizer drops (`unencodable_characters`):
        the policy would be fed, and could only write, the text without them."""
        if self._warned_characters:
            return
        texts = [t for row in rows for t in _texts(row, self.format)]
        lost = unencodable_characters(tokenizer, texts)
        if not lost:
            return
        self._warned_characters = True
        first = next(t for t in texts if any(c in lost for c in t))
        fed = "".join(c for c in first if c not in lost)
        # a transformers tokenizer (third-party)
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        rank_zero_warn(
            f"the tokenizer {name} cannot encode {', '.join(map(repr, lost))} of the prompts and answers of {source}: "
            f"those characters are dropped ({first[:40]!r} is read as {fed[:40]!r}); rewrite the data in the "
            "characters it has, or use a tokenizer that has them (data.tokenizer_path; the built-in tiny:text "
            "holds all printable ASCII)"
        )


def _texts(row: dict[str, Any], fmt: PromptFormat) -> list[str]:
    """The prompt's text (a chat prompt's message contents) and the answer's, when they are strings."""
    prompt = row[fmt.prompt_column]
    texts = [m.get("content") for m in prompt] if is_chat(prompt) else [prompt]
    if fmt.answer_column is not None:
        texts.append(answer_text(row[fmt.answer_column]))
    return [t for t in texts if isinstance(t, str)]


def unencodable_characters(tokenizer: Any, texts: list[str]) -> list[str]:
    """The distinct characters of ``texts`` that ``tokenizer`` encodes as nothing or as its unknown token,
    sorted (the built-in tiny tokenizers drop every character outside their alphabet; a byte-level BPE
    vocabulary has none)."""
    chars = sorted(set("".join(texts)))
    if not chars:
        return []
    ids = tokenizer(chars, add_special_tokens=False)["input_ids"]  # one list per character
    unk = getattr(tokenizer, "unk_token_id", None)  # a transformers tokenizer (third-party)
    return [c for c, i in zip(chars, ids) if not i or (unk is not None and list(i) == [unk])]
