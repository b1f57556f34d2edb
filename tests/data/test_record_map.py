"""The record-mapping hook (data.format.record_map) and every column reaching the reward functions by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from lightning_grpo.callbacks.sampling import score_rollout
from lightning_grpo.data.records import PromptFormat
from lightning_grpo.data.reward_set import RewardSet, RewardSpec
from lightning_grpo.data.sources import HubDataset, Rows
from lightning_grpo.rollout.base import Rollout

ROWS = [{"question": f"{10 + i}", "solution": str(i), "topic": "add" if i % 2 else "sub"} for i in range(4)]

MAPS = """
def to_prompt(row):
    return {"prompt": row.pop("question") + "=", "answer": row.pop("solution"), "hint": row["topic"][0], **row}

def not_a_dict(row):
    return [row]

def fails_on_row_two(row):
    if row["question"] == "12":
        raise KeyError("no_such_column")
    return row
"""


@pytest.fixture
def maps(tmp_path, monkeypatch):
    """A user's module next to their recipe: ``my_maps.py``, importable."""
    (tmp_path / "my_maps.py").write_text(MAPS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_maps"


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


EXPECTED = [
    {"prompt": f"{10 + i}=", "answer": str(i), "hint": "as"[i % 2 == 0], "topic": ("add" if i % 2 else "sub")}
    for i in range(4)
]


@pytest.mark.parametrize("form", ["{m}.to_prompt", "{m}:to_prompt"])
def test_import_path_forms_on_files_datasets_and_sources(make_dm, maps, tmp_path, form):
    path = form.format(m=maps)
    train, val = write_jsonl(tmp_path / "train.jsonl", ROWS), write_jsonl(tmp_path / "val.jsonl", ROWS[:2])
    for options in (
        {"train_files": train, "val_files": val},
        {"source": Rows(ROWS, val=ROWS[:2])},
        {
            "source": HubDataset(
                "json", data_files={"train": train, "val": val}, val_split="val", cache_dir=str(tmp_path / "c")
            )
        },
    ):
        dm = make_dm(
            format=PromptFormat(record_map=path), **options
        )  # prompt_column 'prompt' exists only after the map
        got = [{k: r[k] for k in ("prompt", "answer", "hint", "topic")} for r in dm.train_records]
        assert got == EXPECTED
        assert [r["prompt"] for r in dm.val_records] == ["10=", "11="]
        assert "question" not in dm.train_records[0]  # the map removed it


def test_a_function_from_python(make_dm):
    dm = make_dm(
        source=Rows(ROWS),
        format=PromptFormat(
            prompt_column="question", answer_column=None, record_map=lambda row: {**row, "n": int(row["question"])}
        ),
    )
    assert [r["n"] for r in dm.train_records] == [10, 11, 12, 13]


def test_record_map_errors(make_dm, maps):
    with pytest.raises(
        ValueError, match=r"data.format.record_map 'nowhere.fn' could not be imported: No module named 'nowhere'"
    ):
        PromptFormat(record_map="nowhere.fn")
    with pytest.raises(
        ValueError, match=r"data.format.record_map 'to_prompt' is not an import path; give one like my_module.map_row"
    ):
        PromptFormat(record_map="to_prompt")
    with pytest.raises(
        TypeError,
        match=rf"data.format.record_map {maps}.not_a_dict returned a list for row 0 of data.source.train; expected a dict",
    ):
        make_dm(source=Rows(ROWS), format=PromptFormat(record_map=f"{maps}.not_a_dict"))
    with pytest.raises(
        ValueError,
        match=rf"data.format.record_map {maps}.fails_on_row_two raised KeyError: 'no_such_column' on row 2 of data.source.train",
    ):
        make_dm(source=Rows(ROWS), format=PromptFormat(prompt_column="question", record_map=f"{maps}.fails_on_row_two"))


# -------------------------------------------------------------------------- columns -> rewards
SEEN: dict[str, list] = {}


def sees_columns(completions, hint, topic, raw_prompt, answer, completion_lengths):
    SEEN.update(hint=hint, topic=topic, raw_prompt=raw_prompt, answer=answer, completion_lengths=completion_lengths)
    return [float(c == a) for c, a in zip(completions, answer)]


def test_every_column_reaches_the_reward_functions_by_name(make_dm, maps, tiny_model_path):
    """Columns of the data and those the mapping hook added, repeated over each group."""
    dm = make_dm(source=Rows(ROWS), format=PromptFormat(record_map=f"{maps}.to_prompt"))
    records = dm.train_records[:2]
    ids = dm.tokenizer
    rollout = Rollout(
        prompt_ids=[r["prompt_ids"] for r in records],
        completion_ids=[ids("0")["input_ids"], ids("7")["input_ids"], ids("1")["input_ids"], ids("1")["input_ids"]],
        logprobs=[[0.0]] * 4,
        finished=[True] * 4,
        group_size=2,
    )
    rewards = RewardSet([RewardSpec(sees_columns)])
    scores = score_rollout(rollout, rewards, dm.tokenizer, records)
    assert scores.rewards[:, 0].tolist() == [1.0, 0.0, 1.0, 1.0]
    assert SEEN == {
        "hint": ["s", "s", "a", "a"],
        "topic": ["sub", "sub", "add", "add"],
        "raw_prompt": ["10=", "10=", "11=", "11="],
        "answer": ["0", "0", "1", "1"],
        "completion_lengths": [1, 1, 1, 1],
    }


# ----------------------------------------------------------------- the CLI: cwd is importable
RECIPE = """
seed_everything: 0
trainer:
  accelerator: cpu
  max_steps: 2
  log_every_n_steps: 1
  limit_val_batches: 0
  enable_progress_bar: false
  enable_model_summary: false
  logger:
    class_path: lightning.pytorch.loggers.CSVLogger
    init_args: {save_dir: logs, name: run}
model:
  model: tiny:chars
rollout:
  engine: hf
  sampling: {n: 2, max_new_tokens: 2}
  rewards:
    - name: my_rewards.uses_hint
data:
  train_files: qa.jsonl
  format: {record_map: my_maps.to_prompt}
  batch_size: 2
"""

REWARDS = """
import json

def uses_hint(completions, hint, topic, **columns):
    with open("seen.jsonl", "a") as f:
        f.write(json.dumps({"hint": hint, "topic": topic, "prompt": columns["prompt"], "completions": completions}) + "\\n")
    return [float(c.startswith(h)) for c, h in zip(completions, hint)]
"""


def test_the_console_script_imports_modules_from_the_current_directory(tmp_path, tiny_model_path):
    """``lightning-grpo fit`` (sys.path[0] is the script's folder, not the cwd) finds the record map
    and the reward function next to the recipe; the columns added by the map reach the reward."""
    (tmp_path / "my_maps.py").write_text(MAPS)
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent(REWARDS))
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    write_jsonl(tmp_path / "qa.jsonl", ROWS)
    script = "import sys; sys.path.pop(0); from lightning_grpo.cli import main; sys.argv[0] = 'lightning-grpo'; main()"
    env = {**os.environ, "LIGHTNING_GRPO_CACHE": str(tiny_model_path.parent)}
    done = subprocess.run(
        [sys.executable, "-c", script, "fit", "-c", "recipe.yaml"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = [json.loads(line) for line in (tmp_path / "seen.jsonl").read_text().splitlines()]
    probe = [call for call in seen if "a stand-in completion" in call["completions"]]  # data/reward_probe.py
    assert len(probe) == 1  # called once on stand-ins before training, although fit checks the config twice
    seen = [call for call in seen if call not in probe]
    assert len(seen) == 2  # one call per training step
    by_prompt = {r["prompt"]: r for r in EXPECTED}
    for call in seen:
        assert len(call["prompt"]) == 4  # 2 prompts x 2 samples
        for hint, topic, prompt in zip(call["hint"], call["topic"], call["prompt"]):
            assert (hint, topic) == (by_prompt[prompt]["hint"], by_prompt[prompt]["topic"])
    assert (tmp_path / "logs" / "run" / "version_0" / "metrics.csv").is_file()
