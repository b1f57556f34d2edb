"""Answers reach the records (and the reward functions) as text, whatever JSON type the data gives them."""

from __future__ import annotations

import json
import math

import pytest

from lightning_grpo import RewardSpec
from lightning_grpo.data.columns import answer_text
from lightning_grpo.data.records import PromptFormat
from lightning_grpo.data.reward_set import RewardSet


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("8", "8"),
        (8, "8"),
        (-3, "-3"),
        (8.0, "8"),  # what the reader makes of an 8 in a column that also holds 2.5
        (2.5, "2.5"),
        (1e20, "1e+20"),  # too large to be an exact integer: written as the float it is
        (True, "true"),
        (False, "false"),
        (None, None),
        (math.nan, None),
    ],
)
def test_answer_text(value, text):
    assert answer_text(value) == text


def test_json_numbers_reach_a_reward_that_compares_text(make_dm, tmp_path):
    """The issue's data: ``"answer": 8`` in a JSONL. The records hold "8", so a reward comparing text pays; the
    answer column under its own name keeps the data's value."""
    rows = [{"prompt": "7+1=", "answer": 8, "n": 8}, {"prompt": "1+1=", "answer": 2.5, "n": 2.5}]
    rows += [{"prompt": "0+0=", "answer": None, "n": None}, {"prompt": "t=", "answer": True, "n": True}]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    dm = make_dm(train_files=str(path))
    assert [r["answer"] for r in dm.train_records] == ["8", "2.5", None, "true"]
    by_name = make_dm(train_files=str(path), format=PromptFormat(answer_column="n"))
    assert [r["answer"] for r in by_name.train_records] == ["8", "2.5", None, "true"]
    assert [r["n"] for r in by_name.train_records] == [8.0, 2.5, None, True]  # the column itself, as read

    def exact(completions, answer, **_):
        return [float(c == a) for c, a in zip(completions, answer)]

    columns = {"answer": [dm.train_records[0]["answer"]] * 2}
    assert RewardSet([RewardSpec(exact)]).score(["8", "9"], columns).rewards[:, 0].tolist() == [1.0, 0.0]
