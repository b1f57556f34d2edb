"""Train a shipped recipe for a few steps from the CLI (parse, build, ``trainer.fit``) into a temporary run folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.helpers.bad_input import HF_ENGINE, cli

ROOT = Path(__file__).resolve().parents[2]


def train_recipe(tmp_path: Path, recipe: str, steps: int, engine=None, extra: list[str] = ()):
    """Train ``recipe`` for ``steps`` steps into ``tmp_path/runs/run`` (validation at the last step);
    returns (the CLI, the version folder)."""
    from lightning_grpo import RolloutCallback

    logger = {
        "class_path": "lightning.pytorch.loggers.CSVLogger",
        "init_args": {"save_dir": str(tmp_path / "runs"), "name": "run"},
    }
    args = [
        "-c",
        str(ROOT / "recipes" / recipe),
        f"--trainer.max_steps={steps}",
        f"--trainer.val_check_interval={steps}",
        "--trainer.log_every_n_steps=1",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.logger={json.dumps(logger)}",
        "--data.val_batch_size=50",
        *extra,
    ]
    if engine is None:
        args += HF_ENGINE
    built = cli(args, run=False)
    (callback,) = [c for c in built.trainer.callbacks if isinstance(c, RolloutCallback)]
    if engine is not None:
        callback.use_engine(engine)
    built.trainer.fit(built.model, datamodule=built.datamodule)
    return built, Path(built.trainer.log_dir)


def communicate_or_kill(proc: subprocess.Popen, timeout: float, what: str) -> str:
    """``proc``'s output; past ``timeout`` its whole session (every rank it started) is killed and the
    test fails with the output's tail. ``proc`` must have been started with ``start_new_session=True``."""
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"{what} did not end within {timeout} s:\n{output[-6000:]}")
    return output
