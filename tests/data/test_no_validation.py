"""Training rows without validation rows: said once at setup (no validation, no val/* metrics), with the
options that give some."""

from __future__ import annotations

import logging

from tests.data.test_datamodule import ROWS, write

NOTE = "comes without validation rows"


def _notes(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if NOTE in r.getMessage()]


def test_train_files_alone_say_once_that_nothing_is_validated(make_dm, tmp_path, caplog):
    path = write(ROWS, tmp_path / "train.jsonl", "jsonl")
    with caplog.at_level(logging.INFO):
        dm = make_dm(train_files=path)
        dm.setup("fit")  # Lightning calls it again after prepare_data: nothing more is said
    assert dm.val_records == []
    assert _notes(caplog) == [
        f"data.train_files {path} comes without validation rows: no validation runs and no val/* metrics "
        "(held-out accuracy) are logged; give them with data.val_files (or the source's validation split), or "
        "hold out some training rows with data.val_fraction"
    ]


def test_validation_rows_or_a_held_out_fraction_say_nothing(make_dm, tmp_path, caplog):
    train = write(ROWS, tmp_path / "train.jsonl", "jsonl")
    val = write(ROWS[:2], tmp_path / "val.jsonl", "jsonl")
    with caplog.at_level(logging.INFO):
        assert len(make_dm(train_files=train, val_files=val).val_records) == 2
        assert len(make_dm(train_files=train, val_fraction=0.2).val_records) == 2
    assert _notes(caplog) == []
