"""``lightning-grpo report``: run-dir resolution, the summary's numbers, the PNG, the CLI dispatch,
and a report rendered from a real (short) quickstart run."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import yaml

from lightning_grpo.cli import report

ROOT = Path(__file__).resolve().parents[2]
STEPS = 20
COLUMNS = [
    "epoch",
    "step",
    "train/reward_mean",
    "train/reward_std",
    "train/entropy",
    "train/mismatch_k3",
    "train/mismatch_max_abs",
    "train/frac_reward_zero_std",
    "train/frac_identical_groups",
    "train/skipped_steps",
    "train/grad_norm",
    "train/clip_frac_low",
    "train/completion_length_mean",
    "train/completion_length_min",
    "train/completion_length_max",
    "alarm/zero_reward_std",
    "alarm/entropy",
    "val/greedy_accuracy",
    "val/reward_mean",
]
ZERO_STD_FIRED = (3, 4, 12)
ENTROPY_FIRED = (15,)


def _train_row(step: int) -> dict[str, float]:
    return {
        "epoch": 0,
        "step": step,
        "train/reward_mean": step / 20,  # first tenth (steps 0, 1): 0.025; last tenth (18, 19): 0.925
        "train/reward_std": 0.1,
        "train/entropy": 0.5 if step == 10 else 3.0 - 0.1 * step,  # 3.0 -> 1.1, min 0.5 at step 10
        "train/mismatch_k3": 0.001 * step,  # max 0.019
        "train/mismatch_max_abs": 0.5 if step == 7 else 0.1,
        "train/frac_reward_zero_std": 0.5 if step % 2 else 0.0,  # mean 0.25
        "train/frac_identical_groups": 0.1,
        "train/skipped_steps": 1.0 if step >= 12 else 0.0,
        "train/grad_norm": 1.0 + step,
        "train/clip_frac_low": 0.01,
        "train/completion_length_mean": 2.0,
        "train/completion_length_min": 1.0,
        "train/completion_length_max": 3.0,
    }


def write_run(directory: Path, alarms_jsonl: bool = True) -> Path:
    """A CSVLogger-style version dir: sparse rows (train, alarm and validation rows apart)."""
    directory.mkdir(parents=True)
    rows: list[dict] = [{"step": 0, "val/greedy_accuracy": 0.04, "val/reward_mean": 0.01}]
    for step in range(STEPS):
        rows.append(_train_row(step))
        rows.append({"step": step, "alarm/zero_reward_std": 1.0 if step in ZERO_STD_FIRED else 0.0})
        if step in ENTROPY_FIRED:
            rows.append({"step": step, "alarm/entropy": 1.0})
    rows.append({"step": STEPS - 1, "val/greedy_accuracy": 0.9, "val/reward_mean": 0.85})
    with open(directory / "metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, restval="")
        writer.writeheader()
        writer.writerows(rows)
    if alarms_jsonl:
        with open(directory / "alarms.jsonl", "w") as f:
            for step in ZERO_STD_FIRED:
                message = f"zero std at step {step}"
                f.write(
                    json.dumps({"step": step, "guard": "zero_reward_std", "action": "warn", "message": message}) + "\n"
                )
    return directory


def _assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 20_000, (path, len(data))


# ------------------------------------------------------------------------- synthetic run
def test_rows_merge_by_step(tmp_path):
    run = report.load_run(write_run(tmp_path / "run" / "version_0"))
    assert run.series["train/reward_mean"][:2] == [(0, 0.0), (1, 0.05)]
    assert run.series["val/greedy_accuracy"] == [(0, 0.04), (STEPS - 1, 0.9)]
    assert [s for s, v in run.series["alarm/zero_reward_std"] if v == 1.0] == list(ZERO_STD_FIRED)
    assert "epoch" not in run.series and "step" not in run.series


def test_summary_numbers(tmp_path):
    text, written = report.write_report(write_run(tmp_path / "v"))
    assert written == [tmp_path / "v" / "report.txt", tmp_path / "v" / "report.png"]
    assert (tmp_path / "v" / "report.txt").read_text() == text
    lines = text.splitlines()
    expected = [
        f"run dir: {tmp_path / 'v'}",
        "steps: 20 optimizer steps (last logged step 19)",
        "reward (train/reward_mean): first tenth 0.025 -> last tenth 0.925 (+0.900; 2 of 20 logged values each)",
        "held-out greedy accuracy: 0.040 (step 0) -> 0.900 (step 19)",
        "held-out reward mean: 0.010 (step 0) -> 0.850 (step 19)",
        "entropy: 3.000 -> 1.100 (min 0.500 at step 10)",
        "mismatch: max k3 0.019, max |logp gap| 0.5",
        "skipped optimizer steps: 1",
        "zero-reward-std groups: mean fraction 0.250",
        "identical-sample groups: mean fraction 0.100",
        "what the detectors saw (alarms.jsonl):",
        "  entropy: 1 alarm(s), steps 15..15; first: (no message: alarms.jsonl absent, read from the alarm column)",
        "  zero_reward_std: 3 alarm(s), steps 3..12, action warn; first: zero std at step 3",
    ]
    for line in expected:
        assert line in lines, (line, text)
    _assert_png(tmp_path / "v" / "report.png")


def test_alarms_from_columns_only_and_out_dir(tmp_path):
    text, written = report.write_report(write_run(tmp_path / "v", alarms_jsonl=False), out=tmp_path / "out", png=False)
    assert written == [tmp_path / "out" / "report.txt"] and not (tmp_path / "v" / "report.png").exists()
    assert "what the detectors saw (alarm/* columns):" in text
    assert "  zero_reward_std: 3 alarm(s), steps 3..12; first: (no message" in text


def test_no_alarm_and_missing_panels(tmp_path):
    run_dir = tmp_path / "v"
    run_dir.mkdir()
    (run_dir / "metrics.csv").write_text("epoch,step,train/reward_mean,alarm/entropy\n0,0,0.5,0.0\n0,1,0.7,0.0\n")
    text, _ = report.write_report(run_dir)
    assert "  no alarm fired (guards logging: entropy)" in text
    assert "first tenth 0.500 -> last tenth 0.700" in text
    assert "held-out greedy accuracy: val/greedy_accuracy not logged" in text
    _assert_png(run_dir / "report.png")  # the panels without metrics say "not logged"


def test_no_guards_and_cut_short_alarms_jsonl(tmp_path):
    run_dir = tmp_path / "v"
    run_dir.mkdir()
    (run_dir / "metrics.csv").write_text("epoch,step,train/reward_mean\n0,0,0.25\n")
    (run_dir / "alarms.jsonl").write_text('{"step": 3, "guard": "entro')  # a run killed mid-write
    text, _ = report.write_report(run_dir, png=False)
    assert "steps: 1 optimizer steps (last logged step 0)" in text
    assert "  no alarm fired (no alarm/* columns logged: were any guards configured?)" in text


def test_parent_dir_takes_latest_version(tmp_path):
    write_run(tmp_path / "run" / "version_2")
    write_run(tmp_path / "run" / "version_10")
    (tmp_path / "run" / "version_11").mkdir()  # no metrics.csv yet: not a candidate
    assert report.resolve_run_dir(tmp_path / "run") == tmp_path / "run" / "version_10"


def test_evaluation_only_versions_are_skipped(tmp_path):
    """``lightning-grpo test`` (resolving a checkpoint of version_0) and ``validate`` (no checkpoint) each add a
    version with val/* or test/* only: the report still reads version_0's training, and says what it skipped."""
    run_dir = tmp_path / "run"
    write_run(run_dir / "version_0")
    for name, column, ckpt in (
        ("version_1", "test/reward_mean", f"{run_dir}/version_0/checkpoints/last.ckpt"),
        ("version_2", "val/reward_mean", "null"),
    ):
        (run_dir / name).mkdir()
        (run_dir / name / "metrics.csv").write_text(f"{column},epoch,step\n0.5,0,0\n")
        (run_dir / name / "config.yaml").write_text(f"ckpt_path: {ckpt}\nverbose: true\n")  # validate / test's
    text, _ = report.write_report(run_dir, png=False)
    assert f"steps: {STEPS} optimizer steps (last logged step {STEPS - 1})" in text
    assert "first tenth 0.025 -> last tenth 0.925" in text
    assert "skipped evaluation-only versions (validate / test, no train/* metrics): version_1, version_2" in text
    assert report.load_run(run_dir).versions == [run_dir / "version_0"]
    (run_dir / "version_3").mkdir()  # a fit stopped before its first train/* row: the latest run, still
    (run_dir / "version_3" / "metrics.csv").write_text("val/reward_mean,epoch,step\n0.5,0,0\n")
    (run_dir / "version_3" / "config.yaml").write_text("ckpt_path: null\n")
    assert report.load_run(run_dir).versions == [run_dir / "version_3"]


# ------------------------------------------------------------------------- errors, CLI
def test_missing_metrics_error(tmp_path, capsys):
    (tmp_path / "empty" / "version_0").mkdir(parents=True)
    with pytest.raises(report.RunDirError) as err:
        report.load_run(tmp_path / "empty")
    message = str(err.value)
    assert str(tmp_path / "empty") in message and "metrics.csv" in message and "version_*" in message
    assert report.main([str(tmp_path / "empty")]) == 2
    assert message in capsys.readouterr().err


def test_cli_dispatch(tmp_path, capsys):
    from lightning_grpo.cli import main

    run_dir = write_run(tmp_path / "run" / "version_0")
    with mock.patch("lightning_grpo.cli.build_cli") as build:
        assert main(["report", str(tmp_path / "run"), "--no-png"]) == 0
    build.assert_not_called()
    out = capsys.readouterr().out
    assert "first tenth 0.025 -> last tenth 0.925" in out and (run_dir / "report.txt").is_file()
    assert not (run_dir / "report.png").exists()
    with pytest.raises(SystemExit) as exit_:
        main(["report", str(tmp_path / "nothing")])
    assert exit_.value.code == 2
    with mock.patch("lightning_grpo.cli.build_cli") as build:
        main(["fit", "-c", "recipes/quickstart.yaml"])
    build.assert_called_once_with(["fit", "-c", "recipes/quickstart.yaml"])


def test_report_module_does_not_import_vllm():
    code = "import sys, lightning_grpo.cli.report, lightning_grpo.cli; assert 'vllm' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# ------------------------------------------------------------------ a real quickstart run
def test_report_from_quickstart_run(tmp_path, tiny_cache):
    """30 quickstart steps (HF engine, validation every 10 steps, the recipe's guards and at least
    ZeroStdGuard on), then the report."""
    from lightning_grpo.cli import GRPOCLI, build_cli

    cfg = yaml.safe_load((ROOT / "recipes" / "quickstart.yaml").read_text())
    trainer = cfg["trainer"]
    trainer.update(max_steps=30, val_check_interval=10, log_every_n_steps=1, enable_progress_bar=False)
    trainer["logger"]["init_args"]["save_dir"] = str(tmp_path / "runs")
    cfg["rollout"].update(engine="hf")
    if not any(c["class_path"].endswith("ZeroStdGuard") for c in trainer["callbacks"]):
        trainer["callbacks"].append({"class_path": "lightning_grpo.ZeroStdGuard"})  # it fires early on this task
    cfg["data"]["val_batch_size"] = 50  # the 50 held-out prompts in one batch
    config = tmp_path / "quickstart.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))

    with mock.patch.object(sys, "argv", ["lightning-grpo"]):
        build_cli(["fit", "-c", str(config)], cli_class=GRPOCLI)
    text, written = report.write_report(tmp_path / "runs" / "quickstart")

    run = report.load_run(tmp_path / "runs" / "quickstart")
    reward = run.values("train/reward_mean")
    assert len(reward) == 30
    first, last = report.tenths(reward)
    assert f"first tenth {first:.3f} -> last tenth {last:.3f}" in text
    assert "held-out greedy accuracy: " in text and "(step 0) -> " in text
    assert "zero_reward_std" in text  # the guard's column (fired or not) reached the report
    _assert_png(run.path / "report.png")
    assert written[0] == run.path / "report.txt"
