"""An error that appears mid-run (a reward function raising on a later sample) is one line naming the
reward, the sample and the fix (the traceback with ``LIGHTNING_GRPO_DEBUG=1``), the exit status is 1,
and the run folder says the run failed (``failed.txt``, shown by ``lightning-grpo report``)."""

from __future__ import annotations

import sys
from pathlib import Path
from unittest import mock

import pytest

from lightning_grpo.callbacks.push_check import WeightPushError
from lightning_grpo.cli import main
from lightning_grpo.cli.report import write_report
from lightning_grpo.data.registry import RewardError
from tests.helpers.bad_input import HF_ENGINE

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("tiny_cache")

#: Training batches scored so far by :func:`flaky` (2 prompts x 4 samples = 8 completions each).
SCORED = {"batches": 0}


def flaky(completions, **columns):
    """Scores the first training batch, then raises (at step 1) on everything."""
    if len(completions) == 8:
        SCORED["batches"] += 1
    if SCORED["batches"] >= 2:
        raise KeyError("answer_key")
    return [0.0] * len(completions)


def alternating(completions, **columns):
    """Rewards 0, 1, 0, 1, ...: every group has a signal, so every step moves the policy."""
    return [float(i % 2) for i in range(len(completions))]


def _fails_in_one_line(tmp_path, capsys, *options: str) -> str:
    """Run 3 quickstart steps on the HF engine with ``options``: the run must stop with status 1 and one line
    (no traceback); returns that line."""
    argv = [
        "fit",
        "-c",
        str(ROOT / "recipes" / "quickstart.yaml"),
        *HF_ENGINE,
        "--trainer.max_steps=3",
        "--trainer.limit_val_batches=0",
        "--trainer.log_every_n_steps=1",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
        "--trainer.callbacks=[]",
        "--data.batch_size=2",
        "--rollout.sampling.n=4",
        *options,
    ]
    with mock.patch.object(sys, "argv", ["lightning-grpo", *argv]), pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "[rank0]" not in err, err[-3000:]
    return [line for line in err.splitlines() if line.strip()][-1]


def test_reward_raising_mid_run_is_one_line_and_marks_the_run_failed(tmp_path, capsys):
    SCORED["batches"] = 0
    last = _fails_in_one_line(tmp_path, capsys, f"--rollout.rewards=[{{name: {__name__}.flaky}}]")
    assert last.startswith("lightning-grpo: error: reward function 'flaky' raised KeyError: 'answer_key' on sample 0 ")
    assert "of prompt '" in last and "fix the function" in last and "LIGHTNING_GRPO_DEBUG=1" in last, last
    run_dir = tmp_path / "runs" / "quickstart" / "version_0"
    failed = run_dir / "failed.txt"
    assert f"the traceback is in {failed}" in last, last
    text = failed.read_text()
    assert text.startswith("failed at step 1: RewardError: reward function 'flaky' raised KeyError"), text[:300]
    assert "Traceback" in text and "KeyError: 'answer_key'" in text
    summary, _ = write_report(run_dir, png=False)
    assert "the run failed: failed at step 1: RewardError: reward function 'flaky'" in summary, summary


def test_a_weight_push_that_did_not_land_is_one_line(tmp_path, capsys, monkeypatch):
    from lightning_grpo.rollout.hf import HFEngine

    first: dict = {}
    score = HFEngine.score
    monkeypatch.setattr(HFEngine, "score", lambda self, probe: first.setdefault("scores", score(self, probe)))
    rewards = f"--rollout.rewards=[{{name: {__name__}.alternating}}]"
    last = _fails_in_one_line(tmp_path, capsys, rewards)  # the engine scores as when the probe was taken: stale
    assert last.startswith("lightning-grpo: error: weight push check: HFEngine (its model) at step 1 does not sample")
    assert (
        "the engine still holds step 0's weights (no layer was updated) (the run stopped; the traceback is in" in last
    )
    failed = tmp_path / "runs" / "quickstart" / "version_0" / "failed.txt"
    assert failed.read_text().startswith("failed at step 1: WeightPushError: weight push check: HFEngine")


def test_debug_mode_keeps_the_traceback(monkeypatch):
    from lightning_grpo.cli.run_failure import explained

    err = RewardError("reward function 'f' raised KeyError: 'x' on sample 0")
    assert explained(err, None) is not None
    assert explained(WeightPushError("weight push check: ..."), None) is not None
    assert explained(ValueError("a bug"), None) is None  # any other error keeps its traceback
    monkeypatch.setenv("LIGHTNING_GRPO_DEBUG", "1")
    assert explained(err, None) is None
