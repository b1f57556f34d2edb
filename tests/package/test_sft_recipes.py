"""The SFT recipes (``recipes/sft_*.yaml``, ``recipes/*_sft.yaml``, run with ``lightning-grpo sft fit``): they build and
fail on bad input with one line and nothing written. That the SFT quickstart learns: tests/e2e/test_sft_recipes_learn.py."""

from __future__ import annotations

import sys
from pathlib import Path
from unittest import mock

import pytest

ROOT = Path(__file__).resolve().parents[2]
SFT_RECIPES = sorted([*(ROOT / "recipes").glob("sft_*.yaml"), *(ROOT / "recipes").glob("*_sft.yaml")])


@pytest.mark.parametrize("path", SFT_RECIPES, ids=lambda p: p.stem)
def test_sft_recipe_parses_and_builds(path, tmp_path, tiny_cache):
    """The file builds an SFTModule and an SFTDataModule whose data loads."""
    from lightning_grpo import SFTDataModule, SFTModule
    from lightning_grpo.cli.sft import build_sft_cli

    cli = build_sft_cli(["-c", str(path), "--trainer.logger.init_args.save_dir", str(tmp_path)], run=False)
    assert isinstance(cli.model, SFTModule) and isinstance(cli.datamodule, SFTDataModule)
    cli.datamodule.setup("fit")
    assert len(cli.datamodule.train_records) >= cli.datamodule.batch_size


def test_bad_sft_option_is_one_line_and_writes_nothing(tmp_path, capsys, tiny_cache):
    from lightning_grpo.cli import main

    args = [
        "sft",
        "fit",
        "-c",
        str(ROOT / "recipes/sft_quickstart.yaml"),
        "--trainer.logger.init_args.save_dir",
        str(tmp_path / "runs"),
        "--data.source=lightning_grpo.Rows",
        "--data.source.train=[{question: '1=', answer: '2'}]",
        "--data.batch_size",
        "1",
    ]
    with mock.patch.object(sys, "argv", ["lightning-grpo"]), pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert (
        err.rstrip("\n")
        .splitlines()[-1]
        .startswith(
            "lightning-grpo: error: data.source.train has neither a data.format.messages_column 'messages' (chat transcripts) nor the data.format.prompt_column 'prompt'"
        )
    ), err[-800:]
    assert "Traceback" not in err and not (tmp_path / "runs").exists()
