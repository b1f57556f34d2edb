"""SFT data: rows -> token ids and the assistant-only loss mask (lightning_grpo.data.sft_format), through
the tiny model's tokenizer and the real Qwen3 chat template; bad rows fail with one error naming them."""

from __future__ import annotations

import itertools

import pytest

from lightning_grpo.data.records import PromptFormat
from lightning_grpo.data.sft import SFTDataModule, SFTFormatSettings, collate
from lightning_grpo.data.sft_format import SFTFormat, _turn_end, assistant_mask
from lightning_grpo.data.sources import Rows
from lightning_grpo.data.tasks import DigitTask

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]
TRANSCRIPT = [
    {"role": "system", "content": "You are a careful calculator."},
    {"role": "user", "content": "What is 2 + 3?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}],
    },
    {"role": "tool", "content": "5"},
    {"role": "assistant", "content": "2 + 3 = 5."},
]


def _spans(tokenizer, ids, mask) -> list[str]:
    """The decoded runs of masked tokens, in order."""
    runs = [[i for i, _ in group] for on, group in itertools.groupby(zip(ids, mask), key=lambda x: x[1]) if on]
    return [tokenizer.decode(run) for run in runs]


def test_qwen3_transcript_masks_exactly_the_assistant_turns(qwen_tokenizer):
    """System, user, an assistant tool call, the tool's result, the final answer: the masked tokens are the
    two assistant turns (tool-call text and closing <|im_end|> included; no generation prompt, no newline)."""
    ids, mask = assistant_mask(TRANSCRIPT, qwen_tokenizer, "row 0", TOOLS)
    assert (
        ids
        == qwen_tokenizer(
            qwen_tokenizer.apply_chat_template(TRANSCRIPT, tools=TOOLS, tokenize=False), add_special_tokens=False
        )["input_ids"]
    )
    assert _spans(qwen_tokenizer, ids, mask) == [
        '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>',
        "<think>\n\n</think>\n\n2 + 3 = 5.<|im_end|>",  # Qwen3 writes an empty think block into the last turn
    ]
    unmasked = qwen_tokenizer.decode([i for i, m in zip(ids, mask) if not m])
    for text in ("You are a careful calculator.", "What is 2 + 3?", "<tool_response>\n5\n</tool_response>"):
        assert text in unmasked


def test_last_turn_weight_weighs_the_final_answer_only(qwen_tokenizer):
    """last_turn_weight=4: the final answer's tokens weigh 4, the tool call's 1, the rest 0; the tokens that
    enter the loss are those of the default mask."""
    ids, plain = assistant_mask(TRANSCRIPT, qwen_tokenizer, "row 0", TOOLS)
    same, weights = assistant_mask(TRANSCRIPT, qwen_tokenizer, "row 0", TOOLS, None, 4.0)
    assert same == ids and [w > 0 for w in weights] == [bool(m) for m in plain]
    runs = [(w, qwen_tokenizer.decode(run)) for w, run in _runs(ids, weights)]
    assert runs == [
        (1, '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>'),
        (4.0, "<think>\n\n</think>\n\n2 + 3 = 5.<|im_end|>"),
    ]
    (example,) = SFTFormat(use_chat_template=True, last_turn_weight=4.0).build(
        [{"messages": TRANSCRIPT, "tools": TOOLS}], "d", qwen_tokenizer
    )
    assert example["loss_mask"] == weights
    assert collate([example], pad_id=0)["loss_mask"][0].tolist() == weights


def _runs(ids, weights) -> list[tuple[float, list[int]]]:
    """(weight, token ids) of each run of equally weighted tokens with weight > 0, in order."""
    groups = itertools.groupby(zip(ids, weights), key=lambda x: x[1])
    return [(w, [i for i, _ in group]) for w, group in groups if w > 0]


@pytest.mark.parametrize("weight", [0, -1.0, float("inf"), float("nan"), "2", True])
def test_bad_last_turn_weight_is_named(weight):
    with pytest.raises(ValueError, match=r"last_turn_weight must be a finite number > 0 .*got"):
        SFTFormat(last_turn_weight=weight)


def test_prompt_answer_through_the_chat_template(qwen_tokenizer):
    fmt = SFTFormat(use_chat_template=True, system_prompt="Be brief.")
    (example,) = fmt.build([{"prompt": "2 + 3?", "answer": "5"}], "data.source.train", qwen_tokenizer)
    assert _spans(qwen_tokenizer, example["input_ids"], example["loss_mask"]) == ["<think>\n\n</think>\n\n5<|im_end|>"]
    assert qwen_tokenizer.decode(example["input_ids"]).startswith(
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2 + 3?"
    )


def test_digit_task_rows_are_grpo_prompts_then_the_answer(tiny_model_path):
    """Without the chat template: the prompt ids GRPO samples from (PromptDataModule's), the answer, EOS."""
    from lightning_grpo import PromptDataModule

    sft = SFTDataModule(source=DigitTask(), tokenizer_path=str(tiny_model_path))
    prompts = PromptDataModule(DigitTask(), tokenizer_path=str(tiny_model_path))
    sft.setup(), prompts.setup()
    eos = sft.tokenizer.eos_token_id
    for example, record in zip(sft.train_records[:20], prompts.train_records[:20]):
        answer = sft.tokenizer(record["answer"], add_special_tokens=False)["input_ids"]
        assert example["input_ids"] == record["prompt_ids"] + answer + [eos]
        assert example["loss_mask"] == [0] * len(record["prompt_ids"]) + [1] * (len(answer) + 1)
    batch = collate(sft.train_records[:3] + [{"input_ids": [5, 6], "loss_mask": [0, 1]}], sft.tokenizer.pad_token_id)
    assert batch["input_ids"].shape == batch["attention_mask"].shape == batch["loss_mask"].shape == (4, 7)
    assert batch["attention_mask"][3].tolist() == [1, 1, 0, 0, 0, 0, 0] and batch["loss_mask"][3].sum() == 1


def test_turn_end_skips_what_only_the_last_turn_gets():
    full = [1, 2, 3, 10, 11, 12, 4, 5]  # turn = tokens 3..5 (from index 3), then the next message
    assert _turn_end(full, 3, [1, 2, 3, 10, 11, 12]) == 6  # a prefix
    assert _turn_end(full, 3, [1, 2, 3, 99, 98, 10, 11, 12]) == 6  # 99, 98 written into the last turn only
    assert _turn_end(full, 3, [1, 2, 7, 10, 11, 12]) is None  # an earlier token differs


# ------------------------------------------------------------------------------ bad input
def test_row_without_an_assistant_turn_is_named(qwen_tokenizer):
    rows = [{"messages": TRANSCRIPT}, {"messages": TRANSCRIPT[:2]}]
    with pytest.raises(
        ValueError,
        match=r"row 1 of data.source.train has no assistant turn to train on \(roles: \['system', 'user'\]\)",
    ):
        SFTFormat(use_chat_template=True).build(rows, "data.source.train", qwen_tokenizer)


def test_missing_columns_are_named(tiny_model_path):
    data = SFTDataModule(
        source=Rows([{"question": "1=", "solution": "2"}] * 8), tokenizer_path=str(tiny_model_path), batch_size=2
    )
    with pytest.raises(
        ValueError,
        match=r"data.source.train has neither a data.format.messages_column 'messages'.*prompt_column 'prompt' and "
        r"data.format.answer_column 'answer' \(missing \['prompt', 'answer'\]\); columns present: \['question', 'solution'\]",
    ):
        data.setup()


def test_bad_answers_and_long_rows_are_named(tiny_model_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path))
    with pytest.raises(ValueError, match=r"column 'answer' of row 1 of data must hold a string, got int"):
        SFTFormat().build([{"prompt": "1=", "answer": "2"}, {"prompt": "2=", "answer": 3}], "data", tokenizer)
    with pytest.raises(ValueError, match=r"row 1 of data has 11 tokens, more than data.format.max_length=8"):
        SFTFormat(max_length=8).build(
            [{"prompt": "1=", "answer": "2"}, {"prompt": "12345678=", "answer": "2"}], "data", tokenizer
        )
    with pytest.raises(ValueError, match=r"transcripts; set data.format.use_chat_template: true"):
        SFTFormat().build([{"messages": TRANSCRIPT}], "data", tokenizer)


def test_sft_data_module_takes_keywords_and_its_own_format():
    """SFT's format holds no RL prompt limit; GRPO's PromptFormat is refused naming the type."""
    with pytest.raises(TypeError, match=r"takes 1 positional argument"):
        SFTDataModule(DigitTask())
    with pytest.raises(TypeError, match=r"max_prompt_length"):
        SFTFormatSettings(max_prompt_length=8)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"^data.format must be a lightning_grpo.SFTFormatSettings, got PromptFormat$"):
        SFTDataModule(source=DigitTask(), format=PromptFormat())
    with pytest.raises(
        ValueError, match=r"^data.format.answer_column names the answer SFT teaches; it cannot be null$"
    ):
        SFTFormatSettings(answer_column=None)
    with pytest.raises(ValueError, match=r"^data.format.max_length must be a positive integer or null, got 0$"):
        SFTFormatSettings(max_length=0)
    data = SFTDataModule(source=DigitTask(), format=SFTFormatSettings(max_length=9, last_turn_weight=2.0))
    assert (data._builder.max_length, data._builder.last_turn_weight) == (9, 2.0)
    assert data.format == PromptFormat() and data.hparams["format"]["max_length"] == 9


def test_template_that_rewrites_earlier_turns_is_an_error_naming_the_row(qwen_tokenizer):
    """A template whose rendering of a conversation's beginning is not a prefix of the whole (here: the
    number of messages written first) cannot be masked by prefixes: one error naming the row and turn."""
    import copy

    tokenizer = copy.copy(qwen_tokenizer)
    tokenizer.chat_template = (
        "{{ messages | length }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(
        ValueError,
        match=r"row 0 of data: the chat template renders the conversation before it.*message 2, an assistant turn",
    ):
        assistant_mask(TRANSCRIPT[:1] + TRANSCRIPT[1:2] + TRANSCRIPT[4:], tokenizer, "row 0 of data")
