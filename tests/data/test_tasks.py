"""The built-in digit task: deterministic, disjoint splits, balanced answers, named rules."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from lightning_grpo.data.tasks import DIGIT_RULES, digit_task


@pytest.mark.parametrize(
    ("rule", "digits", "answer"),
    [
        ("last_plus_one", "4821", "2"),
        ("last_plus_one", "4829", "0"),
        ("last_digit", "4821", "1"),
        ("first_digit", "4821", "4"),
        ("first_digit", "0821", "0"),
        ("count_to_last", "4823", "0123"),
        ("count_to_last", "4820", "0"),
        ("count_to_last", "0009", "0123456789"),
    ],
)
def test_rules_on_hand_examples(rule, digits, answer):
    assert DIGIT_RULES.get(rule)(digits) == answer


@pytest.mark.parametrize("rule", ["last_plus_one", "last_digit", "first_digit", "count_to_last"])
def test_records_follow_the_rule(rule):
    train, val = digit_task(seed=3, rule=rule)
    assert (len(train), len(val)) == (300, 50)
    for record in train + val:
        assert set(record) == {"prompt", "answer"}
        assert re.fullmatch(r"\d{4}=", record["prompt"])
        assert record["answer"] == DIGIT_RULES.get(rule)(record["prompt"][:4])


def test_same_seed_same_data_other_seed_other_data():
    assert digit_task(seed=1) == digit_task(seed=1)
    assert digit_task(seed=1)[0] != digit_task(seed=2)[0]
    assert digit_task(seed=1, rule="last_digit") != digit_task(seed=1)


def test_validation_prompts_never_in_training():
    train, val = digit_task(seed=0, num_train=2000, num_val=500)
    train_prompts = [r["prompt"] for r in train]
    val_prompts = [r["prompt"] for r in val]
    assert len(set(train_prompts)) == 2000  # no duplicates either
    assert len(set(val_prompts)) == 500
    assert not set(train_prompts) & set(val_prompts)


@pytest.mark.parametrize("rule", ["last_plus_one", "last_digit", "first_digit"])
def test_answers_are_balanced(rule):
    train, val = digit_task(seed=0, rule=rule)
    assert Counter(r["answer"] for r in train) == {str(d): 30 for d in range(10)}
    assert Counter(r["answer"] for r in val) == {str(d): 5 for d in range(10)}
    # A guess that ignores the prompt scores exactly chance.
    for guess in "0123456789":
        assert sum(r["answer"] == guess for r in train) / len(train) == 0.1


def test_count_to_last_answers_vary_in_length_and_are_balanced():
    train, val = digit_task(seed=0, rule="count_to_last")
    lengths = Counter(len(r["answer"]) for r in train)
    assert lengths == {n: 30 for n in range(1, 11)}  # answers "0", "01", ..., "0123456789"
    assert Counter(len(r["answer"]) for r in val) == {n: 5 for n in range(1, 11)}
    assert {r["answer"] for r in train} == {"0123456789"[:n] for n in range(1, 11)}


def test_uneven_sizes_are_balanced_to_within_one():
    train, val = digit_task(seed=5, num_train=303, num_val=7)
    train_counts, val_counts = Counter(r["answer"] for r in train), Counter(r["answer"] for r in val)
    assert sorted(train_counts[str(d)] for d in range(10)) == [30] * 7 + [31] * 3
    assert sorted(val_counts[str(d)] for d in range(10)) == [0] * 3 + [1] * 7


def test_unknown_rule_lists_the_valid_ones():
    with pytest.raises(
        ValueError,
        match=r"unknown digit task rule 'sum'; valid names: count_to_last, first_digit, last_digit, last_plus_one",
    ):
        digit_task(rule="sum")


def test_bad_sizes():
    with pytest.raises(ValueError, match=r"num_train must be an integer >= 1, got 0"):
        digit_task(num_train=0)
    with pytest.raises(ValueError, match=r"num_val must be an integer >= 0, got -1"):
        digit_task(num_val=-1)
    with pytest.raises(
        ValueError, match=r"rule 'first_digit' has only 1000 distinct prompts with answer \d, but .* need 1001"
    ):
        digit_task(num_train=9990, num_val=20, rule="first_digit")
