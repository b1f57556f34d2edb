"""PromptDataModule with the real Qwen3 tokenizer and chat template (``qwen_tokenizer`` in conftest):
the exact rendered text and ids of system prompts, text prompts and message-list prompts."""

from __future__ import annotations

import json

import pytest

from lightning_grpo.data.datamodule import PromptDataModule
from lightning_grpo.data.records import PromptFormat
from lightning_grpo.data.sources import Files, Rows

IM_START, IM_END, NL = 151644, 151645, 198  # <|im_start|>, <|im_end|>, "\n" in Qwen2/2.5/3's vocabulary
SYSTEM, USER, ASSISTANT = 8948, 872, 77091  # "system", "user", "assistant"


def chatml(*turns: tuple[str, str]) -> str:
    """The Qwen3 template's rendering (no tools) written by hand, ending with the generation prompt."""
    return "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in turns) + "<|im_start|>assistant\n"


def prepared(tok, rows, **fields) -> list[dict]:
    """Records of ``rows`` with the chat template on; ``fields``: more :class:`PromptFormat` fields."""
    dm = PromptDataModule(
        source=Rows(rows), format=PromptFormat(use_chat_template=True, answer_column=None, **fields), batch_size=1
    )
    dm.tokenizer = tok
    dm.setup()
    return dm.train_records


def test_text_prompt_with_system_prompt_exact_text_and_ids(qwen_tokenizer):
    """Loaded from the package's directory like a user's ``tokenizer_path``: ids written out by hand."""
    dm = PromptDataModule(
        source=Rows([{"prompt": "What is 2+3?", "answer": "5"}]),
        tokenizer_path=qwen_tokenizer.name_or_path,
        format=PromptFormat(use_chat_template=True, system_prompt="You are terse."),
        batch_size=1,
    )
    dm.setup()
    record = dm.train_records[0]
    assert record["prompt"] == chatml(("system", "You are terse."), ("user", "What is 2+3?"))
    # "What is 2+3?" = What | " is" | " " | "2" | "+" | "3" | "?" (Qwen splits digits one by one)
    assert record["prompt_ids"] == [
        IM_START, SYSTEM, NL, 2610, 525, 50537, 13, IM_END, NL,
        IM_START, USER, NL, 3838, 374, 220, 17, 10, 18, 30, IM_END, NL,
        IM_START, ASSISTANT, NL,
    ]  # fmt: skip  # a chat message a line
    assert record["answer"] == "5" and dm.tokenizer.eos_token_id == IM_END and dm.tokenizer.pad_token_id == 151643


def test_message_list_prompts_and_the_system_prompt(qwen_tokenizer):
    """A message list without a system message gets ``system_prompt`` first; one with its own keeps it."""
    rows = [
        {"prompt": [{"role": "user", "content": "Hi"}]},
        {"prompt": [{"role": "system", "content": "Row system."}, {"role": "user", "content": "Hi"}]},
        {
            "prompt": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "2+3?"},
            ]
        },
    ]
    records = prepared(qwen_tokenizer, rows, system_prompt="You are terse.")
    assert [r["prompt"] for r in records] == [
        chatml(("system", "You are terse."), ("user", "Hi")),
        chatml(("system", "Row system."), ("user", "Hi")),
        chatml(("system", "You are terse."), ("user", "Hi"), ("assistant", "Hello."), ("user", "2+3?")),
    ]
    assert records[1]["prompt_ids"] == [IM_START, SYSTEM, NL, 3102, 1849, 13, IM_END, NL, IM_START, USER, NL, 13048, IM_END, NL,
                                        IM_START, ASSISTANT, NL]  # fmt: skip  # a chat message a line
    for row, record in zip(rows, records):  # the ids are the tokenizer's own chat-template ids
        system = [] if row["prompt"][0]["role"] == "system" else [{"role": "system", "content": "You are terse."}]
        messages = system + row["prompt"]
        direct = qwen_tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)["input_ids"]
        assert record["prompt_ids"] == list(direct)


def test_message_lists_from_a_jsonl_file(qwen_tokenizer, tmp_path):
    """Rows read by ``datasets``: message dicts with different keys come back with the missing keys as
    None (``name`` here); the template renders them exactly as the rows were written."""
    rows = [
        {"prompt": [{"role": "user", "content": "Hi", "name": "ann"}], "answer": "a"},
        {"prompt": [{"role": "user", "content": "What is 2+3?"}], "answer": "5"},
    ]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    dm = PromptDataModule(
        Files(str(path), cache_dir=str(tmp_path / "cache")),
        format=PromptFormat(use_chat_template=True, system_prompt="You are terse."),
        batch_size=2,
    )
    dm.tokenizer = qwen_tokenizer
    dm.setup()
    assert [r["prompt"] for r in dm.train_records] == [
        chatml(("system", "You are terse."), ("user", "Hi")),
        chatml(("system", "You are terse."), ("user", "What is 2+3?")),
    ]
    assert [r["answer"] for r in dm.train_records] == ["a", "5"]


def test_truncation_keeps_the_last_real_tokens(qwen_tokenizer):
    """``on_long_prompt="truncate"`` keeps the last ``max_prompt_length`` ids of the template's ids."""
    full = qwen_tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], tokenize=True, add_generation_prompt=True
    )
    with pytest.warns(UserWarning, match="truncated 1 of 1 prompts"):
        records = prepared(qwen_tokenizer, [{"prompt": "What is 2+3?"}], max_prompt_length=8, on_long_prompt="truncate")
    assert records[0]["prompt_ids"] == list(full["input_ids"])[-8:] == [10, 18, 30, IM_END, NL, IM_START, ASSISTANT, NL]
    assert records[0]["prompt"] == "+3?<|im_end|>\n<|im_start|>assistant\n"
