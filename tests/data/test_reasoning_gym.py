"""reasoning-gym as a data source and a reward: rows, weights, seeds, held-out split, levels, scores."""

from __future__ import annotations

import collections
import json

import pytest

rg = pytest.importorskip("reasoning_gym")  # the `reasoning-gym` extra, part of `dev` (CI installs it)

from lightning_grpo.data.reasoning_gym import (  # noqa: E402 - after the importorskip of the reasoning-gym extra
    ReasoningGymSource,
    ReasoningGymTask,
    _derive_seed,
    reasoning_gym_score,
)
from lightning_grpo.data.reward_set import RewardSet, RewardSpec  # noqa: E402 - after the importorskip above

SPELL3 = {"name": "spell_backward", "config": {"min_word_len": 3, "max_word_len": 3}}


def mix(**kwargs):
    tasks = kwargs.pop("tasks", [SPELL3, {"name": "chain_sum", "weight": 3.0, "level": 0}])
    return ReasoningGymSource(tasks=tasks, **{"size": 8, "val_size": 4, **kwargs})


# ---------------------------------------------------------------------------------- source rows
def test_weights_split_the_rows_and_rows_are_reasoning_gyms_entries():
    source = mix()
    train = source.train_rows()
    assert collections.Counter(r["task"] for r in train) == {"spell_backward": 2, "chain_sum": 6}  # 8 x 1/4, 3/4
    assert collections.Counter(r["task"] for r in source.val_rows()) == {"spell_backward": 1, "chain_sum": 3}
    # each task's rows are reasoning-gym's own entries, drawn with the seed derived for (seed, split, task, level)
    spell = rg.create_dataset(
        "spell_backward", seed=_derive_seed(0, "train", "spell_backward", None), size=2, min_word_len=3, max_word_len=3
    )
    expected = [spell[i] for i in range(2)]
    got = [r for r in train if r["task"] == "spell_backward"]
    assert [(r["question"], r["answer"], r["metadata"]) for r in got] == [
        (e["question"], e["answer"], e["metadata"]) for e in expected
    ]
    assert all(r["prompt"] == r["question"] and r["level"] == -1 for r in got)
    chain = [r for r in train if r["task"] == "chain_sum"]
    # level 0 of chain_sum's curriculum: two terms of one digit
    assert all(
        r["task_config"]["max_terms"] == 2 and r["task_config"]["max_digits"] == 1 and r["level"] == 0 for r in chain
    )


def test_largest_remainders_give_every_row():
    source = mix(
        tasks=[SPELL3, {"name": "chain_sum", "weight": 1.0}, {"name": "basic_arithmetic", "weight": 1.0}],
        size=10,
        val_size=0,
    )
    assert collections.Counter(r["task"] for r in source.train_rows()) == {
        "spell_backward": 4,
        "chain_sum": 3,
        "basic_arithmetic": 3,
    }
    assert source.val_rows() is None


def test_deterministic_and_seeded():
    a, b, c = mix(seed=3), mix(seed=3), mix(seed=4)
    assert a.train_rows() == b.train_rows() and a.val_rows() == b.val_rows()
    assert [r["question"] for r in a.train_rows()] != [r["question"] for r in c.train_rows()]
    assert a.val_seed == 4 and mix(seed=3, val_seed=9).val_seed == 9


def test_held_out_rows_use_another_seed_and_never_a_training_question():
    source = ReasoningGymSource(tasks=[{"name": "chain_sum", "level": 0}], size=150, val_size=30, seed=0)
    train, val = source.train_rows(), source.val_rows()
    assert len(val) == 30 and len({r["question"] for r in val}) == 30
    assert not {r["question"] for r in val} & {r["question"] for r in train}
    drawn = rg.create_dataset(
        "chain_sum", seed=_derive_seed(1, "val", "chain_sum", 0), size=600, **train[0]["task_config"]
    )
    assert {r["question"] for r in val} <= {e["question"] for e in drawn}


def test_held_out_split_too_small_for_the_question_space():
    source = ReasoningGymSource(tasks=[{"name": "count_bits", "config": {"min_n": 1, "max_n": 3}}], size=40, val_size=2)
    with pytest.raises(
        ValueError, match=r"task 'count_bits' gave only 0 distinct held-out questions .* \(lower val_size"
    ):
        source.val_rows()


def test_system_prompt_makes_chat_messages():
    source = mix(system_prompt="default")
    row = source.train_rows()[0]
    assert row["prompt"] == [
        {"role": "system", "content": rg.utils.SYSTEM_PROMPTS["default"]},
        {"role": "user", "content": row["question"]},
    ]
    assert mix(system_prompt="Answer briefly.").train_rows()[0]["prompt"][0]["content"] == "Answer briefly."


def test_levels_change_the_draw():
    source = ReasoningGymSource(tasks=[{"name": "spell_backward", "level": 0}], size=20, val_size=0)
    assert source.curriculum_tasks() == ["spell_backward"] and source.max_level("spell_backward") == 4
    assert {len(r["answer"]) for r in source.train_rows()} == {3}
    source.set_level("spell_backward", 2)  # word_len levels 3, 5, 7, ...: level 2 spans 3-7 letters
    rows = source.train_rows()
    assert source.level("spell_backward") == 2 and {r["level"] for r in rows} == {2}
    assert rows[0]["task_config"]["max_word_len"] == 7 and max(len(r["answer"]) for r in rows) > 3
    with pytest.raises(ValueError, match=r"level must be in \[0, 4\], got 5"):
        source.set_level("spell_backward", 5)
    with pytest.raises(ValueError, match="follows no curriculum"):
        mix().set_level("spell_backward", 1)


# ------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "tasks, match",
    [
        (
            [{"name": "spell_backwards"}],
            r"tasks\[0\]\.name: unknown reasoning-gym task 'spell_backwards'; close names: \['spell_backward'",
        ),
        ([{"name": "chainsum"}], r"close names: \['chain_sum'"),
        (
            [SPELL3, {"name": "chain_sum", "weight": 0}],
            r"tasks\[1\]\.weight \(chain_sum\): must be a finite number > 0, got 0",
        ),
        ([{"name": "chain_sum", "weight": float("nan")}], r"weight \(chain_sum\): must be a finite number > 0"),
        ([{"name": "chain_sum", "weight": "1"}], r"weight \(chain_sum\): must be a finite number > 0, got '1'"),
        (
            [{"name": "chain_sum", "config": {"min_terms": 2, "nope": 1}}],
            r"tasks\[0\]\.config \(chain_sum\): TypeError: .*nope",
        ),
        (
            [{"name": "chain_sum", "config": {"min_terms": 5, "max_terms": 2}}],
            r"tasks\[0\]\.config \(chain_sum\): AssertionError",
        ),
        ([{"name": "chain_sum", "config": {"seed": 1}}], r"\['seed'\] are set by the source"),
        (
            [{"name": "chain_sum", "level": 99}],
            r"tasks\[0\]\.level \(chain_sum\): must be an integer in \[0, \d+\], got 99",
        ),
        ([{"name": "acre", "level": 0}], r"tasks\[0\]\.level \(acre\): this task has no reasoning-gym curriculum"),
        ([SPELL3, SPELL3], r"names a task twice"),
        ([], r"tasks must be a non-empty list"),
    ],
)
def test_bad_tasks(tasks, match):
    with pytest.raises(ValueError, match=match):
        ReasoningGymSource(tasks=tasks)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"size": 1}, r"data.source.size must be an integer >= 2"),
        ({"val_size": -1}, r"data.source.val_size must be an integer >= 0"),
        ({"seed": 5, "val_seed": 5}, r"val_seed must differ from seed \(5\)"),
    ],
)
def test_bad_sizes_and_seeds(kwargs, match):
    with pytest.raises(ValueError, match=match):
        mix(**kwargs)


def test_tasks_as_dataclasses():
    source = ReasoningGymSource(
        tasks=[ReasoningGymTask("spell_backward", config={"min_word_len": 3, "max_word_len": 3})], size=3, val_size=1
    )
    assert [r["task"] for r in source.train_rows()] == ["spell_backward"] * 3
    assert source.describe("val") == "ReasoningGymSource [spell_backward] split 'val' (seed 1)"


# -------------------------------------------------------------------------------------- reward
def columns(rows, n):
    keys = ("task", "question", "answer", "metadata", "task_config")
    return {k: [r[k] for r in rows for _ in range(n)] for k in keys}


def direct(rows, completions, n, extract):
    """The task's own score_answer, called directly on reasoning-gym datasets built here."""
    out = []
    for i, c in enumerate(completions):
        row = rows[i // n]
        dataset = rg.create_dataset(row["task"], seed=0, size=1, **row["task_config"])
        out.append(
            dataset.score_answer(
                extract(c), {"question": row["question"], "answer": row["answer"], "metadata": row["metadata"]}
            )
        )
    return out


def test_reward_is_the_tasks_own_score_of_the_stripped_completion():
    source = mix(size=4)
    rows = source.train_rows()[:3]
    n = 5
    completions = []
    for r in rows:  # right, right with spaces, one character off, empty, wrong
        a = r["answer"]
        completions += [a, f"  {a}\n", a[:-1] + ("x" if a[-1] != "x" else "y"), "", "zz9"]
    got = reasoning_gym_score(completions, **columns(rows, n))
    assert got == direct(rows, completions, n, str.strip)
    assert got[0] == 1.0 and got[1] == 1.0 and got[3] == 0.0
    spell = [i for i, r in enumerate(rows) if r["task"] == "spell_backward"]
    if spell:  # spell_backward gives partial credit: 2 of 3 letters right
        assert got[spell[0] * n + 2] == pytest.approx(2 / 3)


def test_reward_with_answer_tags_threshold_and_json_columns():
    rows = mix(size=4, tasks=[SPELL3]).train_rows()[:2]
    a0, a1 = rows[0]["answer"], rows[1]["answer"]
    completions = [f"think <answer>{a0}</answer>", a0, f"<answer>{a1[:2]}q</answer>", "<answer> </answer>"]
    cols = columns(rows, 2)
    tagged = reasoning_gym_score(completions, **cols, answer_format="answer_tags")
    assert tagged == direct(rows, completions, 2, rg.utils.extract_answer)
    assert tagged[:3] == [1.0, 0.0, pytest.approx(2 / 3)]  # no tags: None, scored 0
    assert reasoning_gym_score(completions, **cols, answer_format="answer_tags", threshold=1.0) == [1.0, 0.0, 0.0, 0.0]
    as_json = {
        **cols,
        "metadata": [json.dumps(m) for m in cols["metadata"]],
        "task_config": [json.dumps(c) for c in cols["task_config"]],
    }
    assert reasoning_gym_score(completions, **as_json, answer_format="answer_tags") == tagged


def test_reward_in_a_reward_set_and_its_bad_kwargs():
    rows = mix(size=4).train_rows()[:2]
    records = [{**r, "prompt_ids": [0]} for r in rows]
    reward_set = RewardSet(
        [
            RewardSpec("reasoning_gym", alias="solved", weight=0.0, kwargs={"threshold": 1.0}),
            RewardSpec("reasoning_gym"),
        ]
    )
    cols = {k: [r[k] for r in records] for k in records[0]}
    scores = reward_set.score([rows[0]["answer"], "nope"], cols)
    assert scores.rewards.tolist() == [[1.0, 1.0], [0.0, pytest.approx(direct(rows[1:], ["nope"], 1, str.strip)[0])]]
    with pytest.raises(ValueError, match=r"answer_format must be one of \('plain', 'answer_tags'\), got 'xml'"):
        RewardSet([RewardSpec("reasoning_gym", kwargs={"answer_format": "xml"})])
    with pytest.raises(ValueError, match=r"threshold must be a number in \(0, 1\] or null, got 0"):
        RewardSet([RewardSpec("reasoning_gym", kwargs={"threshold": 0})])


# -------------------------------------------------------------------------- in the data module
def test_prompt_data_module_reads_the_source_and_refreshes_at_a_new_level(tmp_path, monkeypatch):
    from lightning_grpo.data.datamodule import PromptDataModule

    monkeypatch.setenv("LIGHTNING_GRPO_CACHE", str(tmp_path))
    source = ReasoningGymSource(tasks=[{"name": "spell_backward", "level": 0}], size=16, val_size=4)
    dm = PromptDataModule(source=source, tokenizer_path="tiny:text", batch_size=8)
    dm.setup()
    assert len(dm.train_records) == 16 and len(dm.val_records) == 4
    record = dm.train_records[0]
    # the text tokenizer spells the fixed instruction as one token, then the word letter by letter
    assert record["prompt"] == record["question"] and len(record["prompt_ids"]) == 1 + 3
    assert dm.tokenizer.decode(record["prompt_ids"]) == record["question"]
    source.set_level("spell_backward", 1)  # 3 to 5 letters
    dm.refresh_train()
    assert {r["level"] for r in dm.train_records} == {1} and max(len(r["answer"]) for r in dm.train_records) == 5
    assert {r["level"] for r in dm.val_records} == {0}  # held-out records stay as drawn at setup


# ------------------------------------------------------------------------- docs/guide/data.md section
from tests.data import test_data_docs as data_docs  # noqa: E402 - the docs section's imports, with its test
from tests.data.test_data_docs import sandbox  # noqa: E402,F401 - the docs' fixture, imported for pytest to find

SECTION = "reasoning-gym tasks"


def test_docs_section_runs_and_parses(sandbox):  # noqa: F811 - the parameter is the fixture imported above
    data_docs.test_python_examples_run(SECTION, sandbox)
    data_docs.test_yaml_examples_parse(SECTION, sandbox)


def test_test_rows_are_none_of_the_training_or_held_out_questions():
    """spell_backward's 3-letter words (about 1060): 2000 training rows cover most of them, so the test draw must
    skip training and held-out words; it leaves the training and held-out rows as they were."""
    source = ReasoningGymSource(tasks=[{"name": "spell_backward", "level": 0}], size=2000, val_size=50, test_size=50)
    plain = ReasoningGymSource(tasks=[{"name": "spell_backward", "level": 0}], size=2000, val_size=50)
    train, val, test = source.train_rows(), source.val_rows(), source.test_rows()
    assert (train, val) == (plain.train_rows(), plain.val_rows()) and plain.test_rows() is None
    questions = [r["question"] for r in test]
    assert len(set(questions)) == 50 and source.test_seed == 2
    assert not set(questions) & {r["question"] for r in train + val}
    assert source.describe("test") == "ReasoningGymSource [spell_backward] split 'test' (seed 2)"
    with pytest.raises(ValueError, match=r"data.source.test_seed must differ from seed \(0\) and val_seed \(1\)"):
        mix(test_size=2, test_seed=1)
