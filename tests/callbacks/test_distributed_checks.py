"""Fast checks of lightning_grpo.callbacks.distributed (the multi-process runs themselves: tests/e2e/test_ranks.py, slow)."""

from __future__ import annotations

import logging
import os

import lightning as L
import pytest

from lightning_grpo.callbacks.distributed import local_log_dir
from tests.helpers.bad_input import HF_ENGINE, cli
from tests.helpers.runs import ROOT


def _build(monkeypatch, caplog, devices: int, cores: int, *extra: str) -> list[str]:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lightning_grpo.callbacks.distributed"):
        cli(
            [
                "-c",
                str(ROOT / "recipes" / "quickstart.yaml"),
                f"--trainer.devices={devices}",
                "--trainer.strategy=ddp",
                *HF_ENGINE,
                *extra,
            ],
            run=False,
        )
    return [r.getMessage() for r in caplog.records if r.name == "lightning_grpo.callbacks.distributed"]


@pytest.mark.usefixtures("tiny_cache")
def test_cpu_devices_beyond_the_cores_warn_in_one_line(monkeypatch, caplog):
    assert _build(monkeypatch, caplog, devices=3, cores=2) == [
        "lightning-grpo: trainer.devices=3 starts 3 CPU processes on 2 available core(s): they share cores "
        "(slower, and collectives may time out); use --trainer.devices 2 or fewer"
    ]
    assert _build(monkeypatch, caplog, devices=2, cores=2) == []


@pytest.mark.usefixtures("tiny_cache")
def test_distributed_timeout_sets_the_strategys_process_group_timeout(monkeypatch, caplog):
    from datetime import timedelta

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    built = cli(
        [
            "-c",
            str(ROOT / "recipes" / "quickstart.yaml"),
            "--trainer.devices=2",
            "--trainer.strategy=ddp",
            *HF_ENGINE,
            "--distributed_timeout=42",
        ],
        run=False,
    )
    assert built.trainer.strategy._timeout == timedelta(seconds=42)
    default = cli(
        ["-c", str(ROOT / "recipes" / "quickstart.yaml"), "--trainer.devices=2", "--trainer.strategy=ddp", *HF_ENGINE],
        run=False,
    )
    assert default.trainer.strategy._timeout == timedelta(seconds=600)


def test_local_log_dir_is_the_trainers_log_dir(tmp_path):
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    for logger in (CSVLogger(tmp_path, name="a"), TensorBoardLogger(tmp_path, name="b"), False):
        trainer = L.Trainer(logger=logger, default_root_dir=tmp_path, accelerator="cpu", devices=1)
        assert local_log_dir(trainer) == trainer.log_dir
