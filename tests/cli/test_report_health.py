"""``lightning-grpo report``'s ``look at:`` section: hand-built metrics.csv files, one healthy, one per unhealthy
figure (each alone gives exactly its line), a learned run (its collapsed entropy and all-right groups are not
faults), and the thresholds as docs/guide/your-own-task.md states them."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from lightning_grpo.cli import report, report_health

ROOT = Path(__file__).resolve().parents[2]
STEPS = 20


def healthy(step: int) -> dict[str, float]:
    """One training row of a run that learns and has not finished: every figure inside its range."""
    return {
        "train/reward_mean": 0.1 + 0.7 * step / (STEPS - 1),  # 0.1 -> 0.8: learning, not learned yet
        "train/reward_max": 1.0,
        "train/entropy": 2.0 - 0.075 * step,  # 2.0 -> 0.575
        "train/mismatch_k3": 0.001,
        "train/skipped_steps": 0.0,
        "train/frac_reward_zero_std": 0.4,
        "train/frac_identical_groups": 0.05,
        "train/truncation_ratio": 0.9,  # cut off, as the quickstart's 2-token completions are, but paid unequally
        "train/truncated_reward_std": 0.3,
    }


def write_metrics(directory: Path, change=lambda step, row: None, accuracy=(0.1, 0.7)) -> Path:
    """A version folder whose metrics.csv holds STEPS healthy rows, each passed through ``change`` first,
    and the held-out greedy accuracy at the first and the last step."""
    directory.mkdir(parents=True)
    rows = []
    for step in range(STEPS):
        row = healthy(step)
        change(step, row)
        rows.append({"epoch": 0, "step": step, **row})
    rows[0]["val/greedy_accuracy"], rows[-1]["val/greedy_accuracy"] = accuracy
    columns = ["epoch", "step", *healthy(0), "val/greedy_accuracy"]
    with open(directory / "metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows(rows)
    return directory


def flagged(directory: Path) -> list[str]:
    return report_health.look_at(report.load_run(directory))


def test_a_healthy_run_gets_no_look_at_section(tmp_path):
    assert flagged(write_metrics(tmp_path / "v")) == []
    text, _ = report.write_report(tmp_path / "v", png=False)
    assert "look at" not in text


def _set(**values):
    return lambda step, row: row.update(values)


UNHEALTHY = {
    "reward: 0 at every logged step": _set(
        **{"train/reward_mean": 0.0, "train/reward_max": 0.0, "train/frac_reward_zero_std": 1.0}
    ),
    "reward: first tenth 0.300 -> last tenth 0.300 (+0.000, under +0.05): not learning": _set(
        **{"train/reward_mean": 0.3}
    ),
    "reward: first tenth 0.500 -> last tenth 0.200 (-0.300, under +0.05): it fell": lambda step, row: row.update(
        {"train/reward_mean": 0.5 if step < 10 else 0.2}
    ),
    "entropy: 0.010 at the end (under 0.05)": lambda step, row: row.update(
        {"train/entropy": 0.01} if step == STEPS - 1 else {}
    ),
    "mismatch: max k3 0.05 (over 0.01)": lambda step, row: row.update({"train/mismatch_k3": 0.05} if step == 7 else {}),
    "skipped optimizer steps: 2 (a non-finite loss or gradient)": lambda step, row: row.update(
        {"train/skipped_steps": 2.0 if step >= 15 else 1.0 if step >= 9 else 0.0}
    ),
    "zero-reward-std groups: mean fraction 0.800 (at least 0.75)": _set(**{"train/frac_reward_zero_std": 0.8}),
    "identical-sample groups: mean fraction 0.300 (at least 0.25)": _set(**{"train/frac_identical_groups": 0.3}),
    "cut-off completions: mean fraction 0.900 (over 0.5), all at one reward": _set(
        **{"train/truncated_reward_std": 0.0}
    ),
}


@pytest.mark.parametrize("start", sorted(UNHEALTHY), ids=lambda s: s.split(":")[0])
def test_each_unhealthy_figure_alone_gives_exactly_its_line(tmp_path, start):
    (line,) = flagged(write_metrics(tmp_path / "v", UNHEALTHY[start]))
    assert line.startswith(start), line


def test_held_out_accuracy_that_falls_while_the_reward_rises(tmp_path):
    (line,) = flagged(write_metrics(tmp_path / "v", accuracy=(0.5, 0.4)))
    assert line.startswith("held-out greedy accuracy: 0.500 -> 0.400 while the training reward rose +0.663"), line


def test_the_section_closes_the_report_and_the_console(tmp_path, capsys):
    write_metrics(tmp_path / "v", UNHEALTHY["zero-reward-std groups: mean fraction 0.800 (at least 0.75)"])
    assert report.main([str(tmp_path / "v"), "--no-png"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[-3].startswith("look at (docs/guide/your-own-task.md says what each means):")
    assert printed[-2].startswith("  zero-reward-std groups: mean fraction 0.800"), printed[-2]
    assert (tmp_path / "v" / "report.txt").read_text().splitlines()[-2:] == printed[-3:-1]


def test_a_learned_task_repeating_its_answer_is_healthy(tmp_path):
    """The end of the quickstart: reward near 1, entropy collapsed, most groups all right and identical."""

    def learned(step, row):
        row.update({"train/reward_mean": 0.1 + 0.9 * step / (STEPS - 1), "train/entropy": 0.01})
        row.update({"train/frac_reward_zero_std": 0.9, "train/frac_identical_groups": 0.6})
        row.update({"train/truncated_reward_std": 0.0})

    assert flagged(write_metrics(tmp_path / "v", learned, accuracy=(0.1, 1.0))) == []


def test_the_page_states_the_thresholds_the_report_uses():
    """docs/guide/your-own-task.md's table of report figures quotes each threshold in the row of its figure."""
    page = (ROOT / report_health.PAGE).read_text()
    rows = {cells[1].strip("` "): cells[2] for line in page.splitlines() if (cells := line.split("|"))[1:3]}
    expected = {
        "reward": [report_health.MIN_REWARD_GAIN, report_health.LEARNED_REWARD],
        "held-out greedy accuracy": [],
        "entropy": [report_health.ENTROPY_FLOOR, report_health.LEARNED_REWARD],
        "mismatch": [report_health.MISMATCH_K3_MAX],
        "skipped optimizer steps": [],
        "zero-reward-std groups": [report_health.ZERO_STD_MAX, report_health.LEARNED_REWARD],
        "identical-sample groups": [report_health.IDENTICAL_MAX, report_health.LEARNED_REWARD],
        "cut-off completions": [report_health.TRUNCATION_MAX, report_health.LEARNED_REWARD],
    }
    for figure, thresholds in expected.items():
        assert figure in rows, f"{report_health.PAGE} has no table row for the report's {figure!r}"
        stated = set(re.findall(r"\d+(?:\.\d+)?", rows[figure]))
        missing = [f"{t:g}" for t in thresholds if f"{t:g}" not in stated]
        assert not missing, f"{report_health.PAGE}, row {figure!r} does not state {missing}: {rows[figure]}"
