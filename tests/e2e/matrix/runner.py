"""Run one matrix cell through the real command line: ``lightning-grpo fit -c <cell config>`` in a
subprocess (its own process group, killed whole on timeout so a hang fails the cell)."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .dimensions import DIMENSIONS

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "recipes" / "quickstart.yaml"
_SCRIPT = Path(sys.executable).with_name("lightning-grpo")
CLI = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "lightning_grpo"]  # what users run
STEPS = 2
TIMEOUT_S = float(
    os.environ.get("LIGHTNING_GRPO_MATRIX_TIMEOUT", 240)
)  # seconds per fit: a hang fails the cell after this


@dataclass
class Finished:
    """A finished command: its exit status, output and seconds."""

    args: list[str]
    returncode: int | None  # None: killed on timeout
    stdout: str
    stderr: str
    seconds: float

    def tail(self, lines: int = 25) -> str:
        return "\n".join((self.stdout + "\n" + self.stderr).strip().splitlines()[-lines:])

    def hang_stacks(self) -> str:
        """The package's frames in the stacks faulthandler printed when the hang was aborted (every
        process, every thread: where each rank waits), else the output's tail."""
        lines = (self.stdout + "\n" + self.stderr).splitlines()
        frames = [line for line in lines if "lightning_grpo/" in line and "/cli/" not in line]
        return "\n".join(frames[-60:]) or self.tail()

    def check(self, what: str) -> Finished:
        if self.returncode is None:
            raise AssertionError(
                f"{what}: no exit after {TIMEOUT_S} s (killed: a hang); the stacks:\n{self.hang_stacks()}"
            )
        if self.returncode != 0:
            raise AssertionError(f"{what}: exit status {self.returncode}\n{self.tail()}")
        return self


def run(args: list[str], cwd: Path, env: dict[str, str], timeout: float = TIMEOUT_S) -> Finished:
    """``args`` in a new process group; on timeout the whole group (DDP ranks, engines) is killed."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:  # SIGABRT first: faulthandler prints where every process hangs
        os.killpg(proc.pid, signal.SIGABRT)
        try:
            out, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            out, err = proc.communicate()
        _kill_group(proc.pid)  # ranks or engine processes that outlived their parent
        code = None
    return Finished(args, code, out, err, time.perf_counter() - start)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def environment(model_cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *filter(None, [env.get("PYTHONPATH")])]
    )  # tests.e2e.matrix.* importable
    env["LIGHTNING_GRPO_CACHE"] = str(model_cache)
    env["PYTHONFAULTHANDLER"] = (
        "1"  # a killed hang shows its stacks  # the session's tiny model (the same one the vLLM server serves)
    )
    for name in ("VLLM_ENABLE_V1_MULTIPROCESSING", "TORCHDYNAMO_DISABLE"):
        env.pop(name, None)  # what the CLI sets for itself, as for a user
    return env


def merge(base: Any, override: Any) -> Any:
    """Deep merge: dicts key by key, anything else replaces."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for key, value in override.items():
            out[key] = merge(base.get(key), value) if key in base else copy.deepcopy(value)
        return out
    return copy.deepcopy(override)


def _fill(value: Any, names: dict[str, str]) -> Any:
    if isinstance(value, str):
        return value.format(**names) if "{" in value else value
    if isinstance(value, list):
        return [_fill(v, names) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, names) for k, v in value.items()}
    return value


def cell_config(cell: dict[str, str], folder: Path, version: str, server_url: str | None) -> dict[str, Any]:
    """The recipe with the cell's values and the matrix's small run settings (2 steps, a checkpoint
    at every step, every completion logged, the logits probe)."""
    config = yaml.safe_load(RECIPE.read_text())
    rollout = dict(config.pop("rollout"))
    rollout.pop("engine", None)  # every engine value sets its own
    config["rollout"] = {"class_path": "lightning_grpo.RolloutCallback", "init_args": rollout}
    for dimension, value in cell.items():
        config = merge(config, DIMENSIONS[dimension][value])
    small = {
        "trainer": {
            "max_steps": STEPS,
            "log_every_n_steps": 1,
            "limit_val_batches": 0,
            "enable_progress_bar": False,
            "enable_model_summary": False,
        },
        "rollout": {"init_args": {"sampling": {"n": 4}, "log_completions": {"every_n_steps": 1, "groups": None}}},
        "data": {"batch_size": 2},
    }
    config = merge(config, small)
    callbacks = [c for c in config["trainer"]["callbacks"] if not c["class_path"].endswith("ModelCheckpoint")]
    checkpoint = {
        "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
        "init_args": {
            "dirpath": str(folder / f"checkpoints-{version}"),
            "filename": "{step}",
            "save_top_k": -1,
            "every_n_train_steps": 1,
            "save_last": True,
        },
    }
    probe = {
        "class_path": "tests.e2e.matrix.probe.LogitsProbe",
        "init_args": {"path": str(folder / f"probe-{version}.pt")},
    }
    config["trainer"]["callbacks"] = [checkpoint, *callbacks, probe]
    names = {
        "server_url": server_url or "http://server-missing:1",
        "run_root": str(folder / "runs"),
        "version": version,
        "step": "{step}",
    }
    return _fill(config, names)


def fit(
    cell: dict[str, str],
    folder: Path,
    version: str,
    env: dict[str, str],
    server_url: str | None,
    ckpt_path: Path | None = None,
    timeout: float = TIMEOUT_S,
) -> Finished:
    """``lightning-grpo fit`` of the cell, writing under ``folder`` (run ``version`` "a", "b", ...)."""
    folder.mkdir(parents=True, exist_ok=True)
    config_file = folder / f"config-{version}.yaml"
    config_file.write_text(yaml.safe_dump(cell_config(cell, folder, version, server_url), sort_keys=False))
    args = [*CLI, "fit", "-c", str(config_file)] + ([f"--ckpt_path={ckpt_path}"] if ckpt_path else [])
    finished = run(args, folder, env, timeout)
    (folder / f"fit-{version}.log").write_text(finished.stdout + "\n--- stderr ---\n" + finished.stderr)
    return finished


def run_dir(folder: Path, version: str) -> Path:
    return folder / "runs" / "run" / version


def checkpoint_at(folder: Path, version: str, step: int) -> Path:
    (found,) = (folder / f"checkpoints-{version}").glob(f"step={step}*")
    return found


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1, default=str)
