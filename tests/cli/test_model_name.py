"""A model name that is neither a folder nor a reachable hub id: one line naming ``model.model`` and what the
name was taken for, within seconds, before any run folder is written."""

from __future__ import annotations

import sys
import time
from unittest import mock

import pytest

from lightning_grpo import GRPOModule
from lightning_grpo.checks import preflight
from lightning_grpo.checks.model_checks import check_model_source
from tests.helpers.bad_input import write_config

pytestmark = pytest.mark.usefixtures("tiny_cache")


def _fit_error(tmp_path, capsys, model: str) -> str:
    from lightning_grpo.cli import main

    path = write_config(tmp_path)
    with mock.patch.object(sys, "argv", ["lightning-grpo"]), pytest.raises(SystemExit) as exit_:
        main(["fit", "-c", str(path), f"--model.model={model}"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err[-2000:]
    assert not (tmp_path / "logs").exists() and not (tmp_path / "root").exists() and not (tmp_path / "runs").exists()
    return err.rstrip("\n").splitlines()[-1]


def test_an_unknown_hub_id_offline_is_one_line_within_seconds_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    started = time.monotonic()
    line = _fit_error(tmp_path, capsys, "no-such-org/no-such-model")
    assert time.monotonic() - started < 60  # the CLI's start-up on a loaded CPU; no hub retries
    assert line == (
        "lightning-grpo: error: model.model: no-such-org/no-such-model was taken for a hub id (no such local folder) "
        "and is not in the local Hugging Face cache and the hub is offline (HF_HUB_OFFLINE is set); expected a "
        "Hugging Face model directory or a hub id that is cached or reachable"
    )


def test_a_missing_folder_is_said_to_be_taken_for_a_local_folder(tmp_path, capsys):
    line = _fit_error(tmp_path, capsys, "./no-such-model")
    assert line.startswith(
        "lightning-grpo: error: model.model: ./no-such-model is not a directory (taken for a local folder"
    )


def test_an_unreachable_hub_is_said_at_once(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", "http://127.0.0.1:9")  # the discard port: refused
    started = time.monotonic()
    with pytest.raises(FileNotFoundError, match=r"^model.model: typo-org/typo was taken for a hub id .* the hub "):
        check_model_source(GRPOModule(model="typo-org/typo"))
    assert time.monotonic() - started < preflight.CONNECT_TIMEOUT_S + 1
    assert "not a valid hub id" in preflight.hub_model_problem("a b")
