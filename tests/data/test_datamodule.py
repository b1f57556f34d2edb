"""PromptDataModule: sources, tokenization, chat template, truncation, loaders, resumable stream."""

from __future__ import annotations

import json
import shutil

import pytest

from lightning_grpo.data.datamodule import PromptDataModule
from lightning_grpo.data.records import PromptFormat
from lightning_grpo.data.sources import Rows
from lightning_grpo.data.tasks import DigitTask
from lightning_grpo.models.tiny import ALPHABET, SPECIAL_TOKENS

VOCAB = {token: i for i, token in enumerate(SPECIAL_TOKENS + ALPHABET)}
ROWS = [{"prompt": f"{1000 + 7 * i}=", "answer": str((7 * i + 1) % 10), "id": i} for i in range(10)]


def char_ids(text: str) -> list[int]:
    """Ids of a text made only of single-character tokens (what the tiny tokenizer must produce)."""
    return [VOCAB[c] for c in text]


def write(rows: list[dict], path, fmt: str) -> str:
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "json":
        path.write_text(json.dumps(rows))
    else:
        import pandas as pd

        frame = pd.DataFrame(rows)
        frame.to_parquet(path) if fmt == "parquet" else frame.to_csv(path, index=False)
    return str(path)


# ------------------------------------------------------------------------------------ sources


@pytest.mark.parametrize("fmt", ["jsonl", "json", "parquet", "csv"])
def test_files_of_every_format(make_dm, tmp_path, fmt):
    path = write(ROWS, tmp_path / f"train.{fmt}", fmt)
    dm = make_dm(train_files=path)
    assert len(dm.train_records) == 10
    assert dm.val_records == []
    for row, record in zip(ROWS, dm.train_records):
        assert record["prompt"] == row["prompt"]
        assert record["prompt_ids"] == char_ids(row["prompt"])
        assert str(record["answer"]) == row["answer"]  # csv reads the digits back as integers
        assert record["id"] == row["id"]


def test_batch_size_prompts_are_enough_and_one_fewer_is_one_error(make_dm):
    """The boundary of the training split's size check: exactly data.batch_size prompts make a batch."""
    assert len(make_dm(source=Rows(ROWS[:4]), batch_size=4).train_records) == 4
    with pytest.raises(ValueError, match=r"holds 3 prompts, fewer than data.batch_size=4"):
        make_dm(source=Rows(ROWS[:3]), batch_size=4)


def test_a_datasets_dataset_and_a_list_of_dicts(make_dm):
    import datasets

    for data in (datasets.Dataset.from_list(ROWS), ROWS):
        dm = make_dm(source=Rows(data, val=ROWS[:3]))
        assert [r["prompt_ids"] for r in dm.train_records] == [char_ids(r["prompt"]) for r in ROWS]
        assert [r["id"] for r in dm.val_records] == [0, 1, 2]
        assert set(dm.train_records[0]) == {"prompt", "answer", "id", "prompt_ids", "raw_prompt"}


def test_val_files(make_dm, tmp_path):
    train = write(ROWS[:6], tmp_path / "train.jsonl", "jsonl")
    val = write(ROWS[6:], tmp_path / "val.jsonl", "jsonl")
    dm = make_dm(train_files=[train], val_files=val)
    assert [r["id"] for r in dm.train_records] == [0, 1, 2, 3, 4, 5]
    assert [r["id"] for r in dm.val_records] == [6, 7, 8, 9]


def test_builtin_digit_task(make_dm):
    from lightning_grpo.data.tasks import digit_task

    dm = make_dm(source=DigitTask(seed=4, rule="first_digit"), batch_size=8)
    train, val = digit_task(seed=4, rule="first_digit")
    assert [r["prompt"] for r in dm.train_records] == [r["prompt"] for r in train]
    assert [r["answer"] for r in dm.val_records] == [r["answer"] for r in val]
    assert dm.train_records[0]["prompt_ids"] == char_ids(train[0]["prompt"])
    ticks = list(dm.train_dataloader())
    assert ticks == [{"micro": 0}] * (300 // 8)  # one generation per step, each of batch_size prompts
    assert all(len(dm.generation_prompts(g)) == 8 for g in range(3))
    assert [len(b) for b in dm.val_dataloader()] == [8] * 6 + [2]


def test_val_fraction_split_is_disjoint_and_deterministic(make_dm):
    dm = make_dm(source=Rows(ROWS), val_fraction=0.3, seed=1)
    train_ids = [r["id"] for r in dm.train_records]
    val_ids = [r["id"] for r in dm.val_records]
    assert (len(train_ids), len(val_ids)) == (7, 3)
    assert sorted(train_ids + val_ids) == list(range(10))
    again = make_dm(source=Rows(ROWS), val_fraction=0.3, seed=1)
    assert [r["id"] for r in again.val_records] == val_ids
    other = make_dm(source=Rows(ROWS), val_fraction=0.3, seed=2)
    assert [r["id"] for r in other.val_records] != val_ids


def test_answer_column_is_copied_to_answer(make_dm):
    rows = [{"question": "12=", "solution": "3"}, {"question": "45=", "solution": "6"}]
    dm = make_dm(source=Rows(rows), format=PromptFormat(prompt_column="question", answer_column="solution"))
    assert dm.train_records[0] == {
        "question": "12=",
        "solution": "3",
        "prompt": "12=",
        "prompt_ids": char_ids("12="),
        "raw_prompt": "12=",
        "answer": "3",
    }
    no_answer = make_dm(source=Rows([{"prompt": "1="}, {"prompt": "2="}]), format=PromptFormat(answer_column=None))
    assert "answer" not in no_answer.train_records[0]


# ------------------------------------------------------------------------------------ loaders


def test_generation_prompts_cover_each_epoch_once_across_ranks(make_dm):
    dm = make_dm(source=Rows(ROWS), batch_size=2, seed=0)
    # 2 ranks x 2 prompts per generation: an epoch of 10 rows spans 2.5 generations
    seen = [r["id"] for g in range(5) for rank in range(2) for r in dm.generation_prompts(g, rank, 2)]
    assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:]) == list(range(10))
    assert seen[:10] != seen[10:]  # a new shuffle per epoch
    assert [r["id"] for r in dm.generation_prompts(3, 1, 2)] == seen[14:16]  # a pure function of (g, rank)
    again = make_dm(source=Rows(ROWS), batch_size=2, seed=0)
    assert [r["id"] for r in again.generation_prompts(3, 1, 2)] == seen[14:16]
    other = make_dm(source=Rows(ROWS), batch_size=2, seed=1)
    assert [r["id"] for g in range(5) for r in other.generation_prompts(g)] != [
        r["id"] for g in range(5) for r in dm.generation_prompts(g)
    ]
    unshuffled = make_dm(source=Rows(ROWS), batch_size=5, shuffle=False)
    assert [[r["id"] for r in unshuffled.generation_prompts(g)] for g in range(2)] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]


def test_refill_rounds_draw_from_a_separate_sequence(make_dm):
    dm = make_dm(source=Rows(ROWS), batch_size=2, seed=0)
    main = [r["id"] for r in dm.generation_prompts(0)]
    refills = [[r["id"] for r in dm.generation_prompts(0, round_=k, max_rounds=3)] for k in (1, 2)]
    assert refills[0] != refills[1] and all(len(r) == 2 for r in refills)
    assert [r["id"] for r in dm.generation_prompts(0)] == main  # refills never shift the schedule


# ------------------------------------------------------------------------------------ templates


CHATML = "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n12=<|im_end|>\n<|im_start|>assistant\n"
CHATML_IDS = (
    [VOCAB["<|im_start|>"]]
    + char_ids("system\nbe brief")
    + [VOCAB["<|im_end|>"]]
    + char_ids("\n")
    + [VOCAB["<|im_start|>"]]
    + char_ids("user\n12=")
    + [VOCAB["<|im_end|>"]]
    + char_ids("\n")
    + [VOCAB["<|im_start|>"]]
    + char_ids("assistant\n")
)


def test_chat_template_and_system_prompt_text(make_dm):
    dm = make_dm(
        source=Rows([{"prompt": "12=", "answer": "3"}] * 2),
        format=PromptFormat(use_chat_template=True, system_prompt="be brief"),
    )
    assert dm.train_records[0]["prompt"] == CHATML
    messages = [{"role": "user", "content": "12="}]
    chat = make_dm(
        source=Rows([{"prompt": messages, "answer": "3"}] * 2),
        format=PromptFormat(use_chat_template=True, system_prompt="be brief"),
    )
    assert chat.train_records[0]["prompt"] == CHATML


def test_chat_template_and_system_prompt_ids(make_dm):
    dm = make_dm(
        source=Rows([{"prompt": "12=", "answer": "3"}] * 2),
        format=PromptFormat(use_chat_template=True, system_prompt="be brief"),
    )
    assert dm.train_records[0]["prompt_ids"] == CHATML_IDS


def test_tokenizer_without_chat_template(tiny_model_path, tmp_path):
    plain = tmp_path / "no-template"
    shutil.copytree(tiny_model_path, plain)
    (plain / "chat_template.jinja").unlink()
    config = json.loads((plain / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    dm = PromptDataModule(
        source=Rows(ROWS), tokenizer_path=str(plain), format=PromptFormat(use_chat_template=True), batch_size=2
    )
    with pytest.raises(
        ValueError, match=rf"data.format.use_chat_template is true but the tokenizer at {plain} has no chat template"
    ):
        dm.setup("fit")


# ------------------------------------------------------------------------------------ long prompts


def test_truncate_keeps_the_last_tokens_and_warns_once(make_dm):
    rows = [{"prompt": "4821=", "answer": "2"}, {"prompt": "12=", "answer": "3"}, {"prompt": "98765=", "answer": "6"}]
    with pytest.warns(
        UserWarning, match=r"truncated 2 of 3 prompts of data.source.train to their last 3 tokens"
    ) as record:
        dm = make_dm(source=Rows(rows, val=rows), format=PromptFormat(max_prompt_length=3, on_long_prompt="truncate"))
    assert len([w for w in record if "truncated" in str(w.message)]) == 1  # not again for the validation split
    assert [r["prompt_ids"] for r in dm.train_records] == [char_ids("21="), char_ids("12="), char_ids("65=")]
    assert [r["prompt"] for r in dm.train_records] == ["21=", "12=", "65="]


def test_long_prompt_error(make_dm):
    rows = [{"prompt": "12=", "answer": "3"}, {"prompt": "4821=", "answer": "2"}]
    with pytest.raises(
        ValueError,
        match=r"prompt 1 of data.source.train has 5 tokens, more than data.format.max_prompt_length=4 \(set data.format.on_long_prompt: truncate",
    ):
        make_dm(source=Rows(rows), format=PromptFormat(max_prompt_length=4))


# ------------------------------------------------------------------------------------ errors


def test_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=rf"data.train_files: file not found: {tmp_path}/missing.jsonl"):
        PromptDataModule(train_files=str(tmp_path / "missing.jsonl"))
    (tmp_path / "data.txt").write_text("x")
    with pytest.raises(
        ValueError,
        match=r"data.train_files: unsupported file type '.txt' for .*data.txt; supported: \['.csv', '.json', '.jsonl', '.parquet'\]",
    ):
        PromptDataModule(train_files=str(tmp_path / "data.txt"))
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match=r"data.val_files: .*empty.jsonl is empty \(holds no rows\)"):
        PromptDataModule(
            train_files=write(ROWS, tmp_path / "train.jsonl", "jsonl"), val_files=str(tmp_path / "empty.jsonl")
        )
    a = write(ROWS, tmp_path / "a.jsonl", "jsonl")
    b = write(ROWS, tmp_path / "b.csv", "csv")
    with pytest.raises(
        ValueError, match=r"data.train_files mixes file types \['csv', 'json'\]; use one type per split"
    ):
        PromptDataModule(train_files=[a, b])


def test_missing_columns_list_the_columns_present(make_dm, tmp_path):
    path = write([{"q": "1=", "a": "2"}], tmp_path / "train.jsonl", "jsonl")
    with pytest.raises(
        ValueError,
        match=rf"data.format.prompt_column 'prompt' not found in data.train_files {path}; columns present: \['q', 'a'\]; "
        r"set data.format.prompt_column to the column that holds the prompts, one of \['q', 'a'\]$",
    ):
        make_dm(train_files=path)
    with pytest.raises(
        ValueError,
        match=r"data.format.answer_column 'answer' not found in data.train_files .*; columns present: \['q', 'a'\]; "
        r"set data.format.answer_column to the column that holds the answers \(or null for data without answers\)$",
    ):
        make_dm(train_files=path, format=PromptFormat(prompt_column="q"))


def test_empty_dataset_is_named(make_dm):
    import datasets

    with pytest.raises(ValueError, match=r"^data.source.train holds no rows$"):
        make_dm(source=Rows(datasets.Dataset.from_list([])))
    with pytest.raises(ValueError, match=r"^data.source.val holds no rows$"):
        make_dm(source=Rows(ROWS, val=[]))


@pytest.mark.parametrize("fraction", [0.0, 1.0, 1.5, -0.1])
def test_val_fraction_out_of_range(fraction):
    with pytest.raises(ValueError, match=rf"data.val_fraction must be in \(0, 1\), got {fraction}"):
        PromptDataModule(source=Rows(ROWS), val_fraction=fraction)


def test_option_conflicts(make_dm, tmp_path):
    with pytest.raises(ValueError, match=r"^data.format.system_prompt needs data.format.use_chat_template: true$"):
        PromptFormat(system_prompt="be brief")
    with pytest.raises(
        ValueError,
        match=r"data.val_fraction splits the training rows, but data.source.train comes with a validation split",
    ):
        make_dm(source=Rows(ROWS, val=ROWS), val_fraction=0.5)
    with pytest.raises(ValueError, match=r"^data.val_files needs data.train_files$"):
        PromptDataModule(val_files="x.jsonl")
    with pytest.raises(ValueError, match=r"^data.test_files needs data.train_files$"):
        PromptDataModule(test_files="x.jsonl")
    with pytest.raises(ValueError, match=r"data.source reads the rows, so data.test_files cannot be given too"):
        PromptDataModule(source=Rows(ROWS, test=ROWS), test_files="x.jsonl")
    with pytest.raises(
        ValueError, match=r"data.val_fraction splits the training rows and cannot be combined with data.val_files"
    ):
        PromptDataModule(train_files=write(ROWS, tmp_path / "t.jsonl", "jsonl"), val_files="x.jsonl", val_fraction=0.5)
    with pytest.raises(
        ValueError,
        match=r"^data.source.rule must be one of count_to_last, first_digit, last_digit, last_plus_one, got 'sum'$",
    ):
        DigitTask(rule="sum")
    with pytest.raises(ValueError, match=r"^data.source.num_train must be an integer >= 1, got 0$"):
        DigitTask(num_train=0)
    with pytest.raises(ValueError, match=r"^data.batch_size must be a positive integer, got 0$"):
        PromptDataModule(DigitTask(), batch_size=0)
    with pytest.raises(ValueError, match=r"^data.format.max_prompt_length must be a positive integer or null, got 0$"):
        PromptFormat(max_prompt_length=0)
    with pytest.raises(ValueError, match=r"^data.format.on_long_prompt must be 'error' or 'truncate', got 'drop'$"):
        PromptFormat(on_long_prompt="drop")
    with pytest.raises(TypeError, match=r"^data.source.train must be a datasets.Dataset or a list of dicts, got str$"):
        Rows("rows.jsonl")


def test_no_data_is_one_error_naming_the_keys():
    with pytest.raises(
        ValueError,
        match=r"^no data: set data.source \(e.g. \{class_path: lightning_grpo.DigitTask\} for the built-in "
        r"digit task, or lightning_grpo.data.sources.HubDataset, Files, Rows\) or data.train_files$",
    ):
        PromptDataModule(batch_size=4)


def test_errors_at_setup(make_dm):
    with pytest.raises(ValueError, match=r"data.source.train holds 10 prompts, fewer than data.batch_size=16"):
        make_dm(source=Rows(ROWS), batch_size=16)
    with pytest.raises(ValueError, match=r"holds chat messages; set data.format.use_chat_template: true"):
        make_dm(source=Rows([{"prompt": [{"role": "user", "content": "1="}], "answer": "2"}] * 2))
    dm = PromptDataModule(source=Rows(ROWS))
    with pytest.raises(RuntimeError, match=r"setup\(\) must run before the data is used"):
        dm.train_dataloader()


def test_grouped_signature_and_exports():
    import inspect

    import lightning_grpo
    import lightning_grpo.data

    params = list(inspect.signature(PromptDataModule).parameters)
    assert params == [
        "source",
        "train_files",
        "val_files",
        "test_files",
        "tokenizer_path",
        "format",
        "batch_size",
        "val_batch_size",
        "val_fraction",
        "shuffle",
        "seed",
    ]
    for name in ("PromptDataModule", "SFTDataModule", "PromptFormat", "DigitTask", "Files", "Rows", "HubDataset"):
        assert getattr(lightning_grpo, name) is getattr(lightning_grpo.data, name)
    sft = inspect.signature(lightning_grpo.SFTDataModule).parameters.values()
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in sft)
