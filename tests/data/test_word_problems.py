"""The counting word problems (lightning_grpo.data.word_problems) and ``chat_template_kwargs`` through the real
Qwen3 chat template: the prompt of a non-thinking Qwen3 ends in its empty think block, and SFT then trains on the
answer alone."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from lightning_grpo.data.records import PromptFormat
from lightning_grpo.data.sft_format import SFTFormat
from lightning_grpo.data.word_problems import CountingWordProblems

THINK = "<think>\n\n</think>\n\n"


def _solve(prompt: str) -> str:
    """The answer read off the prompt by hand: its one count, one up or one down."""
    (count,) = re.findall(r"\d", prompt)
    up, down = "One is added." in prompt, "One is removed." in prompt
    assert up != down, prompt
    return str(int(count) + (1 if up else -1))


def test_answers_follow_the_story_and_splits_share_no_prompt():
    task = CountingWordProblems(num_train=3000, num_val=200, num_test=200, seed=3)
    splits = {"train": task.train_rows(), "val": task.val_rows(), "test": task.test_rows()}
    assert {k: len(v) for k, v in splits.items()} == {"train": 3000, "val": 200, "test": 200}
    for rows in splits.values():
        for row in rows:
            assert row["answer"] == _solve(row["prompt"]) == row["demonstration"]
            assert (row["change"] == "up") == (int(row["answer"]) > int(re.findall(r"\d", row["prompt"])[0]))
    prompts = {name: {r["prompt"] for r in rows} for name, rows in splits.items()}
    assert (
        len(prompts["train"]) == 3000
        and not prompts["train"] & prompts["val"]
        and not prompts["train"] & prompts["test"]
    )
    assert not prompts["val"] & prompts["test"]
    assert Counter(r["answer"] for r in splits["train"]).keys() == set("0123456789")
    assert (
        CountingWordProblems(num_train=3000, num_val=200, num_test=200, seed=3).train_rows() == splits["train"]
    )  # every rank


def test_the_weak_demonstrator_slips_on_its_digits_only():
    rows = CountingWordProblems(num_train=4000, seed=0, weak_digits="456789", slip=0.85).train_rows()
    weak = [r for r in rows if r["answer"] in "456789"]
    slipped = [r for r in weak if r["demonstration"] != r["answer"]]
    assert all(r["demonstration"] == r["answer"] for r in rows if r["answer"] in "0123")
    assert all(r["demonstration"] == str((int(r["answer"]) + 1) % 10) for r in slipped)
    assert len(slipped) / len(weak) == pytest.approx(0.85, abs=0.03)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_val": 0}, "CountingWordProblems.num_val"),
        ({"num_train": 9000}, "at most 6000"),
        ({"weak_digits": "4a"}, "CountingWordProblems.weak_digits"),
        ({"slip": 1.5}, "CountingWordProblems.slip"),
    ],
)
def test_bad_options_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CountingWordProblems(**kwargs)


def test_enable_thinking_false_puts_the_empty_think_block_in_the_prompt(qwen_tokenizer):
    row = {
        "prompt": "Maya keeps shells in a box. The tally reads 4. One is removed. What does it read now?",
        "answer": "3",
    }
    thinking = PromptFormat(use_chat_template=True).render(row["prompt"], qwen_tokenizer, "rows", 0)
    plain = PromptFormat(use_chat_template=True, chat_template_kwargs={"enable_thinking": False}).render(
        row["prompt"], qwen_tokenizer, "rows", 0
    )
    assert plain == thinking + THINK and thinking.endswith("<|im_start|>assistant\n")
    # SFT: the think block moves into the prompt, and the loss covers the answer alone
    for kwargs, trained in ((None, THINK + "3<|im_end|>"), ({"enable_thinking": False}, "3<|im_end|>")):
        (example,) = SFTFormat(use_chat_template=True, chat_template_kwargs=kwargs).build([row], "rows", qwen_tokenizer)
        ids, mask = example["input_ids"], example["loss_mask"]
        assert qwen_tokenizer.decode([i for i, m in zip(ids, mask) if m]) == trained
        first = mask.index(1)
        assert qwen_tokenizer.decode(ids[:first]) == (plain if kwargs else thinking)  # the prompt GRPO samples after


@pytest.mark.parametrize(
    "options, match",
    [
        (
            {"chat_template_kwargs": {"enable_thinking": False}},
            "data.format.chat_template_kwargs needs data.format.use_chat_template: true",
        ),
        (
            {"use_chat_template": True, "chat_template_kwargs": ["enable_thinking"]},
            "data.format.chat_template_kwargs must be a mapping",
        ),
    ],
)
def test_bad_chat_template_kwargs_are_named(options, match):
    with pytest.raises(ValueError, match=match):
        PromptFormat(**options)
