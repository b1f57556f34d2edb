"""Data sources: HubDataset on local dataset folders (load_dataset and save_to_disk), the source
option of PromptDataModule, refresh_train, and a source through the real CLI parser."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets
import pytest

from lightning_grpo.data.datamodule import PromptDataModule
from lightning_grpo.data.records import PromptFormat
from lightning_grpo.data.sources import DataSource, HubDataset
from lightning_grpo.models.tiny import ALPHABET, SPECIAL_TOKENS
from tests.helpers.bad_input import cli, write_config

VOCAB = {token: i for i, token in enumerate(SPECIAL_TOKENS + ALPHABET)}
TRAIN = [{"prompt": f"{1000 + 7 * i}=", "answer": str((7 * i + 1) % 10), "level": i % 3} for i in range(6)]
TEST = [{"prompt": f"{2000 + i}=", "answer": str((i + 1) % 10), "level": 9} for i in range(3)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def folder(tmp_path) -> Path:
    """A dataset folder as users keep them: one file per split."""
    write_jsonl(tmp_path / "my_data" / "train.jsonl", TRAIN)
    write_jsonl(tmp_path / "my_data" / "test.jsonl", TEST)
    return tmp_path / "my_data"


def hub(path, tmp_path, **kwargs) -> HubDataset:
    return HubDataset(str(path), cache_dir=str(tmp_path / "hf-cache"), **kwargs)


# ----------------------------------------------------------------------------- HubDataset
def test_a_local_folder_of_jsonl_files(make_dm, folder, tmp_path):
    dm = make_dm(source=hub(folder, tmp_path, val_split="test"))
    assert [r["prompt"] for r in dm.train_records] == [r["prompt"] for r in TRAIN]
    assert [r["prompt_ids"] for r in dm.train_records[:1]] == [[VOCAB[c] for c in "1000="]]
    assert [r["answer"] for r in dm.val_records] == ["1", "2", "3"]
    assert [r["level"] for r in dm.train_records] == [0, 1, 2, 0, 1, 2]  # every column is kept
    no_val = make_dm(source=hub(folder, tmp_path))
    assert no_val.val_records == []


def test_a_folder_under_the_home_directory(make_dm, folder, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    dm = make_dm(source=hub("~/my_data", tmp_path))
    assert len(dm.train_records) == len(TRAIN)


@pytest.mark.parametrize("single", [False, True], ids=["DatasetDict", "Dataset"])
def test_a_save_to_disk_folder(make_dm, tmp_path, single):
    splits = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(TRAIN), "test": datasets.Dataset.from_list(TEST)}
    )
    saved = tmp_path / "saved"
    (splits["train"] if single else splits).save_to_disk(str(saved))
    dm = make_dm(source=HubDataset(str(saved), val_split=None if single else "test"))
    assert [r["prompt"] for r in dm.train_records] == [r["prompt"] for r in TRAIN]
    assert [r["prompt"] for r in dm.val_records] == ([] if single else [r["prompt"] for r in TEST])


def test_config_names_and_data_files(make_dm, tmp_path):
    root = tmp_path / "configs"
    write_jsonl(root / "easy" / "train.jsonl", TRAIN[:2])
    write_jsonl(root / "hard" / "train.jsonl", TRAIN[2:])
    (root / "README.md").write_text(
        "---\nconfigs:\n"
        "- config_name: easy\n  data_files:\n  - split: train\n    path: easy/train.jsonl\n"
        "- config_name: hard\n  data_files:\n  - split: train\n    path: hard/train.jsonl\n---\n"
    )
    hard = make_dm(source=hub(root, tmp_path, name="hard"))
    assert [r["prompt"] for r in hard.train_records] == [r["prompt"] for r in TRAIN[2:]]
    with pytest.raises(
        ValueError, match=r"data.source.name: could not load .*, name='medium' split 'train'.*'medium' not found"
    ):
        make_dm(source=hub(root, tmp_path, name="medium"))
    # a builder name with data_files per split
    files = {"train": str(root / "hard" / "train.jsonl"), "test": str(root / "easy" / "train.jsonl")}
    dm = make_dm(source=hub("json", tmp_path, data_files=files, val_split="test"))
    assert [r["prompt"] for r in dm.val_records] == [r["prompt"] for r in TRAIN[:2]]


def test_revision_and_data_files_reach_load_dataset(monkeypatch, make_dm):
    calls: list[dict[str, Any]] = []

    def fake_load_dataset(path, name=None, **kwargs):
        calls.append({"path": path, "name": name, **kwargs})
        return datasets.Dataset.from_list(TRAIN)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    make_dm(
        source=HubDataset("org/data", name="main", revision="v1.0", data_files={"train": "a.parquet"}, val_split="dev")
    )
    expected = {
        "path": "org/data",
        "name": "main",
        "revision": "v1.0",
        "data_files": {"train": "a.parquet"},
        "cache_dir": None,
    }
    assert calls == [{**expected, "split": "train"}, {**expected, "split": "dev"}]


def test_chat_message_prompts_from_a_parquet_folder(make_dm, tmp_path):
    rows = [
        {"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"{i}2="}], "answer": "3"}
        for i in range(2)
    ]
    root = tmp_path / "chat"
    root.mkdir()
    datasets.Dataset.from_list(rows).to_parquet(str(root / "train.parquet"))
    dm = make_dm(source=hub(root, tmp_path), format=PromptFormat(use_chat_template=True))
    assert (
        dm.train_records[0]["prompt"]
        == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n02=<|im_end|>\n<|im_start|>assistant\n"
    )
    assert dm.train_records[1]["raw_prompt"] == rows[1]["prompt"]  # the messages, before the template


# ---------------------------------------------------------------------------------- errors
def test_hub_dataset_errors(make_dm, folder, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"data.source.path: no such folder or file: ./nowhere"):
        HubDataset("./nowhere")
    with pytest.raises(
        ValueError, match=r"data.source.val_split 'validation' not found in .*my_data; its splits: \['train', 'test'\]"
    ):
        make_dm(source=hub(folder, tmp_path, val_split="validation"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(TRAIN)}).save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(
        ValueError, match=r"data.source.train_split 'training' not found in .*saved; its splits: \['train'\]"
    ):
        make_dm(source=HubDataset(str(tmp_path / "saved"), train_split="training"))
    with pytest.raises(
        ValueError,
        match=r"data.source.revision is for datasets.load_dataset, but .*saved is a folder written by save_to_disk",
    ):
        HubDataset(str(tmp_path / "saved"), revision="main")
    with pytest.raises(
        ValueError,
        match=r"data.format.prompt_column 'question' not found in HubDataset .*my_data split 'train'; columns present: \['prompt', 'answer', 'level'\]",
    ):
        make_dm(source=hub(folder, tmp_path), format=PromptFormat(prompt_column="question"))


def test_source_excludes_files_and_datasets(folder, tmp_path):
    with pytest.raises(ValueError, match=r"data.source reads the rows, so data.train_files cannot be given too"):
        PromptDataModule(source=hub(folder, tmp_path), train_files=str(folder / "train.jsonl"))
    with pytest.raises(ValueError, match=r"data.source reads the rows, so data.val_files cannot be given too"):
        PromptDataModule(source=hub(folder, tmp_path), val_files=str(folder / "test.jsonl"))
    with pytest.raises(TypeError, match=r"data.source must be a lightning_grpo.data.sources.DataSource, got list"):
        PromptDataModule(source=TRAIN)


def test_val_fraction_with_a_source(make_dm, folder, tmp_path):
    dm = make_dm(source=hub(folder, tmp_path), val_fraction=0.5, seed=1)
    assert sorted(r["prompt"] for r in dm.train_records + dm.val_records) == sorted(r["prompt"] for r in TRAIN)
    assert len(dm.val_records) == 3
    with pytest.raises(
        ValueError,
        match=r"val_fraction splits the training rows, but HubDataset .*my_data split 'train' comes with a validation split \(HubDataset .*my_data split 'test'\)",
    ):
        make_dm(source=hub(folder, tmp_path, val_split="test"), val_fraction=0.5)


# ------------------------------------------------------------------------------ refresh_train
class Growing(DataSource):
    """A source whose training rows change between reads (as a curriculum's would)."""

    def __init__(self) -> None:
        self.size = 4

    def train_rows(self) -> list[dict[str, Any]]:
        return [{"prompt": f"{n}=", "answer": str(n % 10)} for n in range(self.size)]

    def val_rows(self) -> list[dict[str, Any]]:
        return [{"prompt": "9=", "answer": "0"}]


def add_level(row: dict) -> dict:
    return {**row, "level": len(row["prompt"])}


def test_refresh_train_rereads_maps_and_retokenizes(make_dm):
    source = Growing()
    dm = make_dm(source=source, batch_size=3, format=PromptFormat(record_map=add_level), seed=0)
    assert len(dm.train_records) == 4
    before = [r["prompt"] for g in range(4) for r in dm.generation_prompts(g)]
    assert sorted(before[:4]) == ["0=", "1=", "2=", "3="]
    source.size = 12
    dm.refresh_train()
    assert [r["prompt"] for r in dm.train_records] == [f"{n}=" for n in range(12)]
    assert dm.train_records[11]["prompt_ids"] == [VOCAB["1"], VOCAB["1"], VOCAB["="]]
    assert [r["level"] for r in dm.train_records] == [2] * 10 + [3] * 2  # the mapping hook ran again
    assert [r["prompt"] for r in dm.val_records] == ["9="]  # validation records stay
    # the schedule follows the new count: 4 generations of 3 cover the 12 new records once
    after = [r["prompt"] for g in range(4) for r in dm.generation_prompts(g)]
    assert sorted(after) == sorted(f"{n}=" for n in range(12))
    source.size = 2
    with pytest.raises(ValueError, match=r"Growing split 'train' holds 2 prompts, fewer than data.batch_size=3"):
        dm.refresh_train()
    with pytest.raises(RuntimeError, match=r"setup\(\) must run before refresh_train\(\)"):
        PromptDataModule(source=Growing()).refresh_train()


# ------------------------------------------------------------------------------------- CLI
def test_a_source_in_a_recipe_through_the_cli(folder, tmp_path, tiny_cache):
    """The recipe form of the docs parses, instantiates and trains 2 steps on the folder's rows."""
    source = {
        "class_path": "lightning_grpo.data.sources.HubDataset",
        "init_args": {
            "path": str(folder),
            "train_split": "train",
            "val_split": "test",
            "cache_dir": str(tmp_path / "c"),
        },
    }
    path = write_config(
        tmp_path,
        **{"data.source": source, "data.batch_size": 2, "trainer.max_steps": 2, "trainer.log_every_n_steps": 1},
    )
    parsed = cli(["-c", str(path)], run=False)
    assert isinstance(parsed.datamodule.source, HubDataset)
    assert (parsed.datamodule.source.path, parsed.datamodule.source.val_split) == (str(folder), "test")
    run = cli(["fit", "-c", str(path)])
    assert run.trainer.global_step == 2
    assert [r["prompt"] for r in run.datamodule.train_records] == [r["prompt"] for r in TRAIN]
    metrics = (tmp_path / "logs" / "run" / "version_0" / "metrics.csv").read_text().splitlines()
    assert "train/reward_mean" in metrics[0].split(",") and len(metrics) == 3  # header + one row per step
