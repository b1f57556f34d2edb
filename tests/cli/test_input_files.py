"""Bad input files and resume folders: a data file that is not UTF-8 names the
file and the line; a recipe with a tab names the recipe file and the line; ``--ckpt_path last``
with no checkpoint to resume from refuses to start (Lightning would warn and train from scratch)."""

from __future__ import annotations

import sys
from unittest import mock

import pytest

from lightning_grpo import PromptDataModule
from tests.helpers.bad_input import cli, write_config

pytestmark = pytest.mark.usefixtures("tiny_cache")


def main_error(args: list[str], capsys) -> list[str]:
    """The stderr lines of ``lightning-grpo ARGS`` that exits with status 2 (a configuration error)."""
    from lightning_grpo.cli import main

    with mock.patch.object(sys, "argv", ["lightning-grpo"]), pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2
    return capsys.readouterr().err.rstrip("\n").splitlines()


_BAD_LINE = b'{"prompt": "caf\xe9=", "answer": "1"}\n'  # latin-1 e-acute: not UTF-8


@pytest.mark.parametrize(
    ("name", "content", "line", "offset"),
    [
        ("qa.jsonl", b'{"prompt": "12=", "answer": "3"}\n{"prompt": "4=", "answer": "5"}\n' + _BAD_LINE, 3, 65 + 15),
        ("qa.csv", b"prompt,answer\n12=,3\ncaf\xe9=,1\n", 3, 23),
    ],
    ids=["jsonl", "csv"],
)
def test_non_utf8_data_file_names_the_file_and_line(tmp_path, name, content, line, offset):
    path = tmp_path / name
    path.write_bytes(content)
    dm = PromptDataModule(train_files=str(path), tokenizer_path="tiny:chars", batch_size=1)
    message = (
        rf"^data.train_files: {path} is not UTF-8 text: byte 0xe9 at offset {offset} \(line {line}\); "
        r"re-save it as UTF-8"
    )
    with pytest.raises(ValueError, match=message):
        dm.setup("fit")


def test_yaml_tab_error_names_the_recipe_file_and_line(tmp_path, capsys):
    path = write_config(tmp_path)
    lines = path.read_text().splitlines()
    lines[2] = "\t" + lines[2].lstrip()  # a tab where YAML wants spaces
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(SystemExit):
        cli(["fit", "-c", str(path)])
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"lightning-grpo: error: {path}, line 3, column 1: "), err[0]
    assert "tab" in err[0] and "<unicode string>" not in err[0], err[0]


def test_ckpt_path_last_without_a_checkpoint_refuses_to_start_fresh(tmp_path, capsys):
    path = write_config(tmp_path)
    err = main_error(["fit", "-c", str(path), "--ckpt_path", "last"], capsys)
    run_folder = tmp_path / "logs" / "run"
    assert err[-1] == (
        f"lightning-grpo: error: --ckpt_path last: no checkpoint to resume in {run_folder} "
        "(searched version_*/checkpoints/*.ckpt); drop --ckpt_path to start a fresh run"
    ), err
    assert not run_folder.exists()


def test_non_utf8_file_in_a_dataset_folder_names_the_file(tmp_path):
    from lightning_grpo.data.sources import HubDataset

    folder = tmp_path / "qa"
    folder.mkdir()
    (folder / "train.jsonl").write_bytes(b'{"prompt": "12=", "answer": "3"}\n' + _BAD_LINE)
    dm = PromptDataModule(source=HubDataset(str(folder)), tokenizer_path="tiny:chars", batch_size=1)
    with pytest.raises(
        ValueError,
        match=rf"^data.source.path: {folder / 'train.jsonl'} is not UTF-8 text: byte 0xe9 at offset 48 \(line 2\)",
    ):
        dm.setup("fit")
