"""Resume from the command line (``--ckpt_path last``) and the report of a resumed run: its version
folders stitched by step, other runs in the same folder named and left out; the step progress bar."""

from __future__ import annotations

import csv
import json
import signal
import warnings
from pathlib import Path

import pytest
import torch

from lightning_grpo.cli import report
from tests.helpers.bad_input import HF_ENGINE, cli
from tests.helpers.interrupt import CtrlC
from tests.helpers.runs import ROOT

pytestmark = pytest.mark.usefixtures("tiny_cache")


def _version(
    folder: Path, steps: range, reward: float, resumed_from: Path | None = None, alarms: list[int] = ()
) -> Path:
    folder.mkdir(parents=True)
    with open(folder / "metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["epoch", "step", "train/reward_mean"])
        writer.writeheader()
        writer.writerows({"epoch": 0, "step": s, "train/reward_mean": reward} for s in steps)
    ckpt = f"'{resumed_from / 'checkpoints' / 'last.ckpt'}'" if resumed_from is not None else "null"
    (folder / "config.yaml").write_text(f"seed_everything: 0\nckpt_path: {ckpt}\n")
    (folder / "alarms.jsonl").write_text(
        "".join(
            json.dumps({"step": s, "guard": "entropy", "action": "warn", "message": f"at {s}"}) + "\n" for s in alarms
        )
    )
    return folder


def test_report_stitches_the_versions_of_a_resumed_run_by_step(tmp_path):
    """version_0: steps 0-5 (crashed after its checkpoint at step 4); version_1 resumed from it at step 4;
    version_2 resumed from version_1; version_3 is another run (no ckpt_path)."""
    run = tmp_path / "run"
    v0 = _version(run / "version_0", range(6), 0.1, alarms=[1, 5])
    v1 = _version(run / "version_1", range(4, 8), 0.5, resumed_from=v0, alarms=[6])
    _version(run / "version_2", range(8, 10), 0.9, resumed_from=v1)
    loaded = report.load_run(run / "version_2")
    assert [p.name for p in loaded.versions] == ["version_0", "version_1", "version_2"]
    assert loaded.series["train/reward_mean"] == [(s, 0.1) for s in range(4)] + [(s, 0.5) for s in range(4, 8)] + [
        (8, 0.9),
        (9, 0.9),
    ]
    assert [a["step"] for a in loaded.alarms["entropy"]] == [1, 6]  # version_0's step-5 alarm was re-run by version_1
    _version(run / "version_3", range(3), 0.0)
    text, _ = report.write_report(run, png=False)  # the latest version is another run: it alone is read
    assert "steps: 3 optimizer steps (last logged step 2)" in text
    assert (
        "read version_3 only; other runs there: version_0, version_1, version_2 (pass one as RUN_DIR to read it)"
        in text
    )
    text, _ = report.write_report(run / "version_2", png=False)
    assert "steps: 10 optimizer steps (last logged step 9)" in text
    assert "versions: version_0 -> version_1 -> version_2 (a resumed run, stitched by step" in text
    assert "read version_0, version_1, version_2 only; other runs there: version_3" in text


def _csv_logger(tmp_path) -> str:
    """A CSVLogger writing runs/run/version_N under ``tmp_path``, as a --trainer.logger value."""
    return json.dumps(
        {
            "class_path": "lightning.pytorch.loggers.CSVLogger",
            "init_args": {"save_dir": str(tmp_path / "runs"), "name": "run"},
        }
    )


def test_ckpt_path_last_resumes_the_newest_checkpoint_and_the_report_stitches(tmp_path, capsys):
    """``fit --ckpt_path last`` after a 3-step run continues at step 3 in version_1 (its config.yaml names
    version_0's last.ckpt), and ``lightning-grpo report runs/run`` covers steps 0-4; the progress bar
    counts steps of max_steps."""
    logger = _csv_logger(tmp_path)
    base = [
        "fit",
        "-c",
        str(ROOT / "recipes" / "quickstart.yaml"),
        *HF_ENGINE,
        "--trainer.log_every_n_steps=1",
        "--trainer.limit_val_batches=0",
        f"--trainer.logger={logger}",
    ]
    first = cli([*base, "--trainer.max_steps=3", "--trainer.enable_progress_bar=false"])
    assert first.trainer.global_step == 3
    second = cli([*base, "--trainer.max_steps=5", "--ckpt_path=last"])
    assert second.trainer.global_step == 5
    version_0, version_1 = tmp_path / "runs" / "run" / "version_0", tmp_path / "runs" / "run" / "version_1"
    assert f"ckpt_path: {version_0 / 'checkpoints' / 'last.ckpt'}" in (version_1 / "config.yaml").read_text()
    captured = capsys.readouterr()
    bar = (captured.out + captured.err).replace("\r", "\n")  # Lightning's bars write to stdout
    assert "step: 100%" in bar and "5/5" in bar and "Epoch" not in bar and "v_num" not in bar
    text, _ = report.write_report(tmp_path / "runs" / "run", png=False)
    assert "versions: version_0 -> version_1" in text and "steps: 5 optimizer steps (last logged step 4)" in text
    assert len(report.load_run(tmp_path / "runs" / "run").values("train/reward_mean")) == 5


def test_ctrl_c_saves_the_step_and_prints_the_resume_command_that_continues_there(tmp_path, capsys, monkeypatch):
    """A KeyboardInterrupt at the start of step 2 (of 4): last.ckpt holds step 2, one line says where it is and
    the command that resumes; that command continues at step 2 without Lightning's "unreliable results" warning."""
    monkeypatch.setattr(CtrlC, "pressed", False)
    logger = _csv_logger(tmp_path)
    args = [
        "fit",
        "-c",
        str(ROOT / "recipes" / "quickstart.yaml"),
        *HF_ENGINE,
        "--trainer.max_steps=4",
        "--trainer.log_every_n_steps=1",
        "--trainer.limit_val_batches=0",
        "--trainer.enable_progress_bar=false",
        f"--trainer.logger={logger}",
        "--trainer.callbacks+=tests.helpers.interrupt.CtrlC",
        "--trainer.callbacks.step=2",
    ]
    sigint = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit) as exit_:
            cli(args)
    finally:
        signal.signal(signal.SIGINT, sigint)  # Lightning ignores further Ctrl-C while it shuts down
    assert exit_.value.code == 1
    version_0 = tmp_path / "runs" / "run" / "version_0"
    saved, config = version_0 / "checkpoints" / "last.ckpt", version_0 / "config.yaml"
    command = f"lightning-grpo fit -c {config} --ckpt_path last"
    assert f"lightning-grpo: interrupted at step 2: saved {saved}; resume with: {command}" in capsys.readouterr().err
    assert torch.load(saved, map_location="cpu", weights_only=False)["global_step"] == 2

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = cli(command.split()[1:])
    assert resumed.trainer.global_step == 4
    assert not [w for w in caught if "unreliable results" in str(w.message)]
    with open(tmp_path / "runs" / "run" / "version_1" / "metrics.csv", newline="") as f:
        steps = [int(row["step"]) for row in csv.DictReader(f) if row.get("train/reward_mean")]
    assert steps == [2, 3]
