"""``lightning-grpo fit`` under DDP (2 CPU ranks, gloo) from the command line, as the docs show it:
the completion log on every rank's step, and runs whose rank fails, hangs or gets SIGTERM end
(all ranks) within a timeout, naming the rank. Each run is a subprocess in its own session, killed
whole when the test's own timeout passes, so a hang fails the test instead of blocking it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.run_helpers import ROOT
from tests.test_distributed import _LAUNCH_PREFIXES, _LAUNCH_VARS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available"),
]


def _command(tmp_path: Path, steps: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "lightning_grpo", "fit", "-c", str(ROOT / "recipes" / "quickstart.yaml"),
            "--trainer.devices=2", "--trainer.strategy=ddp", f"--trainer.max_steps={steps}",
            "--trainer.limit_val_batches=0", "--trainer.enable_progress_bar=false",
            f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
            "--rollout.engine=hf", "--rollout.vllm_args=null", *extra]  # fmt: skip


def _fault(tmp_path: Path, kind: str, step: int = 1) -> str:
    init = {"marker_dir": str(tmp_path / "markers"), "rank": 1, "step": step, "kind": kind}
    return "--trainer.callbacks+=" + json.dumps({"class_path": "tests.rank_faults.RankFault", "init_args": init})


def _start(command: list[str], tiny_model_path: Path, cwd: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARS and not k.startswith(_LAUNCH_PREFIXES)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["LIGHTNING_GRPO_CACHE"] = str(Path(tiny_model_path).parent)  # the session's tiny model, built once
    return subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip


def _finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str, float]:
    """(exit status, output, seconds); the test fails (after killing the whole session) past ``timeout``."""
    start = time.monotonic()
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"the run did not end within {timeout} s:\n{output[-5000:]}")
    finally:
        _kill_leftovers(proc.pid)
    return proc.returncode, output, time.monotonic() - start


def _kill_leftovers(session: int) -> None:
    try:
        os.killpg(session, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_ddp_quickstart_writes_the_completion_log(tiny_model_path, tmp_path):
    """Rank 0 writes completions.jsonl while rank 1 trains on (the log directory was read by rank 0
    alone: a broadcast that met rank 1's all-reduce, and both waited forever)."""
    proc = _start(_command(tmp_path, 3, "--rollout.log_completions.every_n_steps=1", "--rollout.log_completions.groups=1"),
                  tiny_model_path, tmp_path)  # fmt: skip
    rc, output, _ = _finish(proc, 240)
    assert rc == 0, output[-5000:]
    rows = [json.loads(line) for line in (tmp_path / "runs" / "quickstart" / "version_0" / "completions.jsonl").open()]
    assert [r["step"] for r in rows] == [s for s in range(3) for _ in range(8)]  # 1 group of 8 samples per step
