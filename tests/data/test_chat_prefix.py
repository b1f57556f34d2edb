"""The chat-template check (lightning_grpo.data.chat_prefix): a conversation's growing prefixes rendered with the
real Qwen3 template, which drops an earlier assistant turn's <think> block once a user message follows, are
flagged with the message and the first differing token; the tiny model's ChatML template, which keeps every
prefix, is not. SFTDataModule warns at setup."""

from __future__ import annotations

import copy
import warnings

import pytest

from lightning_grpo.agents.secret_digit import SecretDigitTranscripts
from lightning_grpo.data.chat_prefix import first_break, last_turn_extra, rewrite_warning
from lightning_grpo.data.records import PromptFormat
from lightning_grpo.data.sft import SFTDataModule, SFTFormatSettings
from lightning_grpo.data.sources import Rows

THINKING = [
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
    {"role": "user", "content": "times 3?"},
    {"role": "assistant", "content": "<think>\nmultiply\n</think>\n\n12"},
]
#: The same conversation without reasoning: Qwen3 writes an empty <think> block into the last assistant turn only.
PLAIN = [{**m, "content": m["content"].split("\n\n")[-1]} for m in THINKING]


@pytest.fixture(scope="module")
def chatml_tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_path))


def test_qwen3_dropping_an_earlier_think_block_is_found(qwen_tokenizer):
    """<|im_start|> user \\n 2 + 2 ? <|im_end|> \\n <|im_start|> assistant \\n are tokens 0-11 of both renderings;
    token 12 is <think> (151667) while message 1 is the last one, '4' (19) once the user's message follows."""
    hit = first_break(qwen_tokenizer, THINKING, extra=last_turn_extra(qwen_tokenizer))
    assert (hit.appended, hit.changed, hit.position) == (2, 1, 12)
    assert (hit.before, hit.after) == ("'<think>' (id 151667)", "'4' (id 19)")
    line = rewrite_warning(qwen_tokenizer, [(PLAIN, None, "row 0 of x"), (THINKING, None, "row 1 of x")], "Meaning.")
    assert line == (
        "the chat template rewrites earlier turns: in row 1 of x, appending message 2 (user) changes how message 1 "
        "(assistant) renders: token 12 '<think>' (id 151667) becomes '4' (id 19) (1 of 2 conversations checked). "
        "Meaning. (docs/guide/troubleshooting.md#the-chat-template-rewrites-earlier-turns)"
    )


def test_qwen3_last_turn_empty_think_block_is_not_a_rewrite(qwen_tokenizer):
    """Qwen3's empty <think> block, written into the last assistant turn only, is the template's own text: plain
    turns, tool calls (the secret-digit transcripts) and reasoning before a tool result (kept) pass."""
    assert last_turn_extra(qwen_tokenizer) == "<think>\n\n</think>\n\n"
    assert last_turn_extra(qwen_tokenizer, {"enable_thinking": False}) == "<think>\n\n</think>\n\n"
    rows = SecretDigitTranscripts(num_train=1).train_rows()
    call = rows[0]["messages"][1]["tool_calls"]
    tool_loop = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "<think>\nr\n</think>\n\n", "tool_calls": call},
        {"role": "tool", "content": "7"},
        {"role": "assistant", "content": "7"},
    ]
    conversations = [
        (PLAIN, None, "a"),
        (rows[0]["messages"], rows[0]["tools"], "b"),
        (tool_loop, rows[0]["tools"], "c"),
    ]
    assert rewrite_warning(qwen_tokenizer, conversations, "Meaning.") is None
    assert rewrite_warning(qwen_tokenizer, conversations, "Meaning.", {"enable_thinking": False}) is None
    # without the last-turn allowance the empty block would count: appending the user message drops it
    assert first_break(qwen_tokenizer, PLAIN).position == 12


def test_a_template_that_keeps_prefixes_is_silent(chatml_tokenizer):
    assert last_turn_extra(chatml_tokenizer) == ""
    assert first_break(chatml_tokenizer, THINKING) is None
    assert rewrite_warning(chatml_tokenizer, [(THINKING, None, "row 0")], "Meaning.") is None


def test_sft_setup_warns_on_qwen3_transcripts_with_reasoning(qwen_tokenizer, chatml_tokenizer):
    """SFTDataModule.setup: one warning naming the row, off with template_check_rows 0, none on ChatML."""

    def setup(tokenizer, rows, **fmt):
        dm = SFTDataModule(source=Rows([{"messages": m} for m in rows]), batch_size=1, format=SFTFormatSettings(**fmt))
        dm.tokenizer = tokenizer  # the session's tokenizer (setup loads tokenizer_path otherwise)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dm.setup("fit")
        return [str(w.message) for w in caught if "chat template" in str(w.message)]

    (line,) = setup(qwen_tokenizer, [PLAIN, THINKING], use_chat_template=True)
    assert line.startswith(
        "the chat template rewrites earlier turns: in row 1 of data.source.train, appending message 2 (user) changes how "
        "message 1 (assistant) renders: token 12 '<think>' (id 151667) becomes '4' (id 19) (1 of 2 conversations "
        "checked). SFT trains on the whole transcript's rendering"
    ), line
    assert setup(qwen_tokenizer, [PLAIN, THINKING], use_chat_template=True, template_check_rows=1) == []
    assert setup(qwen_tokenizer, [THINKING], use_chat_template=True, template_check_rows=0) == []
    assert setup(chatml_tokenizer, [THINKING], use_chat_template=True) == []


def test_sft_rows_without_the_chat_template_are_not_rendered(chatml_tokenizer):
    """Prompt / answer rows fed as plain text: nothing to check, so a tokenizer without a chat template is fine."""
    plain = copy.deepcopy(chatml_tokenizer)
    plain.chat_template = None
    dm = SFTDataModule(source=Rows([{"prompt": "12=", "answer": "3"}] * 2), batch_size=1)
    dm.tokenizer = plain
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dm.setup("fit")
    assert len(dm.train_records) == 2


@pytest.mark.parametrize("rows", [-1, 1.5, True, "4"])
def test_template_check_rows_must_be_a_count(rows):
    with pytest.raises(ValueError, match=rf"data.format.template_check_rows must be an integer >= 0, got {rows!r}"):
        PromptFormat(template_check_rows=rows)
