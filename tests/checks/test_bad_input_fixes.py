"""Bad input, part 3: errors that name the problem also name its fix, in the same one line (parts 1 and 2:
tests/checks/test_bad_input.py, tests/checks/test_bad_input_fit.py). A missing prompt or answer column is
answered with the column that looks like it, a broken JSON line with its file, line and column, a reward
module that cannot be imported with where Python looked, a YAML key at the wrong depth with the key meant,
and an answer with no one text (a list, a dict) is refused before any record is built."""

from __future__ import annotations

import os
import sys
from unittest import mock

import pytest

from lightning_grpo import HubDataset, PromptDataModule, PromptFormat, RewardSpec, SFTDataModule
from lightning_grpo.cli.misplaced import near_keys
from lightning_grpo.data.reward_set import RewardSet
from lightning_grpo.data.sources import Rows
from tests.helpers.bad_input import write_config

pytestmark = pytest.mark.usefixtures("tiny_cache")


def _setup_error(dm) -> str:
    with pytest.raises(ValueError) as err:
        dm.setup("fit")
    return str(err.value)


# ================================================================ missing columns: the one that looks like it
@pytest.mark.parametrize(
    ("rows", "fmt", "fix"),
    [
        ([{"question": "12=", "answer": "3"}], PromptFormat(), "set data.format.prompt_column: question"),
        (
            [{"question": "12=", "problem": "12=", "answer": "3", "id": 4}],
            PromptFormat(),
            "set data.format.prompt_column to the column that holds the prompts, one of ['question', 'problem']",
        ),
        (
            [{"x": [{"role": "user", "content": "12="}], "answer": "3", "n": 1}],
            PromptFormat(),
            "set data.format.prompt_column: x",  # no prompt-like name: the one column of text or chat messages
        ),
        (
            [{"prompt": "12=", "solution": 3}],
            PromptFormat(),
            "set data.format.answer_column: solution (or null for data without answers)",
        ),
        (
            [{"q": "12=", "gold": "3", "target": "3"}],
            PromptFormat(prompt_column="q"),
            "set data.format.answer_column to the column that holds the answers, one of ['gold', 'target'] "
            "(or null for data without answers)",
        ),
    ],
    ids=["prompt_one", "prompt_several", "prompt_by_value", "answer_one", "answer_several"],
)
def test_a_missing_column_names_the_column_that_looks_like_it(rows, fmt, fix):
    message = _setup_error(PromptDataModule(source=Rows(rows), format=fmt, batch_size=1))
    column = "prompt_column" if fmt.prompt_column not in rows[0] else "answer_column"
    expected = (
        f"data.format.{column} {getattr(fmt, column)!r} not found in data.source.train; "
        f"columns present: {list(rows[0])}; {fix}"
    )
    assert message == expected


def test_sft_names_both_missing_columns():
    dm = SFTDataModule(source=Rows([{"question": "1=", "solution": "2"}] * 2), batch_size=1)
    assert _setup_error(dm) == (
        "data.source.train has neither a data.format.messages_column 'messages' (chat transcripts) nor the "
        "data.format.prompt_column 'prompt' and data.format.answer_column 'answer' (missing ['prompt', 'answer']); "
        "columns present: ['question', 'solution']; set data.format.prompt_column: question; "
        "set data.format.answer_column: solution"
    )


# ========================================================================== answers: text, or refused
@pytest.mark.parametrize(("value", "kind"), [([1, 2], "list"), ({"a": 1}, "dict")])
def test_an_answer_with_no_one_text_is_refused_before_any_record(value, kind):
    rows = [{"prompt": "12=", "answer": "3"}, {"prompt": "4=", "answer": value}]
    dm = PromptDataModule(source=Rows(rows), batch_size=1)
    assert _setup_error(dm) == (
        f"data.format.answer_column 'answer' of data.source.train holds a {kind} in row 1 ({value!r}); answers reach "
        "the reward functions as text: write each answer as one string, or set data.format.answer_column: null "
        f"(the column 'answer' still reaches the reward functions by name, as a {kind})"
    )
    assert dm.train_records is None  # nothing was built


# ==================================================================================== broken JSON lines
def test_a_broken_jsonl_line_is_named_by_file_line_and_column(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"prompt": "12=", "answer": "3"}\n\n{"prompt": "45=", "answer": 6\n')
    with pytest.raises(ValueError) as err:
        PromptDataModule(train_files=str(path), batch_size=1).setup("fit")
    assert str(err.value) == (
        f"data.train_files: {path} line 3, column 30 is not valid JSON: Expecting ',' delimiter: the line ends before "
        'its object is closed; fix that line: each line must hold one JSON object, e.g. {"prompt": "12=", "answer": '
        '"3"} (strings in double quotes)'
    )
    path.write_text("{'prompt': '12=', 'answer': '3'}\n")
    with pytest.raises(ValueError, match=r"line 1, column 2 is not valid JSON: Expecting property name enclosed in"):
        PromptDataModule(train_files=str(path), batch_size=1).setup("fit")


def test_a_broken_line_in_a_dataset_folder_is_named_too(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"prompt": "12=", "answer": "3"}\n["12=", "3"]\n')
    with pytest.raises(ValueError) as err:
        HubDataset(str(tmp_path)).train_rows()
    assert str(err.value) == (
        f"data.source.path: {tmp_path / 'train.jsonl'} line 2 holds a JSON list, not an object; each line must hold "
        'one JSON object, e.g. {"prompt": "12=", "answer": "3"}'
    )


# ================================================================================ a reward not importable
def test_a_reward_module_not_found_says_where_python_looked():
    with pytest.raises(ValueError) as err:
        RewardSet([RewardSpec("my_missing_rewards.exact")])
    assert str(err.value) == (
        "reward function 'my_missing_rewards.exact' could not be imported: No module named 'my_missing_rewards'; "
        f"the current folder is {os.getcwd()}: my_missing_rewards must be importable from it or from PYTHONPATH "
        "(run from the folder that holds my_missing_rewards.py, or e.g. PYTHONPATH=path/to/that/folder "
        "lightning-grpo fit ...)"
    )
    with pytest.raises(ValueError) as err:  # the module is there, the function is not: no word on the search path
        RewardSet([RewardSpec("os.path.no_such_fn")])
    assert (
        str(err.value)
        == "reward function 'os.path.no_such_fn' could not be imported: module 'posixpath' has no attribute 'no_such_fn'"
    )


# ============================================================================= YAML keys at the wrong depth
@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (
            {"rollout.max_new_tokens": 3},
            "rollout.max_new_tokens: not an option of lightning_grpo.RolloutCallback "
            "(did you mean rollout.sampling.max_new_tokens?)",
        ),
        (
            {"rollout.sampling.engine": "hf"},
            "rollout.sampling.engine: not an option of lightning_grpo.SamplingConfig (did you mean rollout.engine?)",
        ),
        (
            {"rollout.sampling.overlong_filter": True},
            "rollout.sampling.overlong_filter: not an option of lightning_grpo.SamplingConfig "
            "(did you mean rollout.selection.overlong_filter?)",
        ),
        (
            {"data.format.batch_size": 2},
            "data.format.batch_size: not an option of 'data' (did you mean data.batch_size?)",
        ),
        ({"data.max_new_tokens": 3}, "data.max_new_tokens: not an option of 'data'"),  # two levels away: no guess
    ],
    ids=["dedented", "indented", "sibling_group", "flat_group", "too_far"],
)
def test_a_key_at_the_wrong_depth_names_the_key_meant(tmp_path, capsys, overrides, line):
    from lightning_grpo.cli import main

    path = write_config(tmp_path, **overrides)
    with mock.patch.object(sys, "argv", ["lightning-grpo"]), pytest.raises(SystemExit) as exit_:
        main(["fit", "-c", str(path), "--print_config"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"lightning-grpo: error: {line}"


def test_near_keys_look_one_level_down_up_and_sideways():
    keys = {"a.b.n", "a.c.n", "a.n", "n", "a.b.c.n", "d.n", "a.b.m"}
    assert near_keys("a.b.n", keys) == ["a.b.c.n", "a.c.n", "a.n"]
    assert near_keys("a.n", keys) == ["a.b.n", "a.c.n", "d.n", "n"]
    assert near_keys("n", keys) == ["a.n", "d.n"]
    assert near_keys("a.b.x", keys) == []
