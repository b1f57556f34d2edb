"""Run a two-stage Qwen3 track (recipes/qwen3_<track>_sft.yaml, then recipes/qwen3_<track>_grpo.yaml from its run
folder; ``--track tool`` or ``text``) for several seeds, each seed its own initialisation of tiny:qwen3, and measure
what each stage gives.

Per seed: SFT steps and the SFT dev accuracy (greedy, against the demonstrations) at its last check; GRPO's dev
greedy accuracy (tool: 50 validation episodes per check, each with its own secret; text: the task's 100 validation
prompts) at GRPO step 0 (the warm start) and at the end; the **test** greedy accuracy of the GRPO run's last
checkpoint (``lightning-grpo test``: tool: 50 episodes from the test seed stream; text: the task's 100 test prompts;
no setting was chosen on either, docs/evidence/tuning.md); the wall time of each stage. Writes a markdown table between the
``<!-- qwen3-<track>-results -->`` markers of docs/evidence/qwen3.md with ``--write``.

    python benchmarks/qwen3_seeds.py --track tool --seeds 0 1 2 --jobs 2 --write

With ``--jobs N`` up to N seeds go at once, each pinned to its own CPU core with one thread, so each wall time is
that of a run alone on one core. Extra arguments after ``--`` go to the GRPO stage.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import time
from pathlib import Path

from quickstart_seeds import (
    FIXED_ORDER,
    forget_test,
    machine_line,
    map_on_cores,
    test_split,
    threads_note,
    write_learning_table,
)

ROOT = Path(__file__).resolve().parents[1]
TRACKS = ("tool", "text")


def stages(track: str) -> dict[str, tuple[str, ...]]:
    return {
        "sft": ("sft", "fit", "-c", f"recipes/qwen3_{track}_sft.yaml"),
        "grpo": ("fit", "-c", f"recipes/qwen3_{track}_grpo.yaml", *FIXED_ORDER),
    }


def marker(track: str) -> str:
    return f"<!-- qwen3-{track}-results -->"


def _stage(track: str, name: str, seed: int, save: Path, extra: list[str], core: int | None) -> float:
    """Run one stage into ``save`` (its runs/ folder), pinned to ``core``; its wall seconds (cached in ``save``)."""
    done = save / f"{name}_wall_seconds.txt"
    if done.is_file():
        return float(done.read_text())
    forget_test(save / "runs")  # a new run replaces the checkpoint the cached test figures came from
    cmd = [
        sys.executable,
        "-m",
        "lightning_grpo",
        *stages(track)[name],
        "--seed_everything",
        str(seed),
        "--trainer.logger.init_args.save_dir",
        str(save / "runs"),
        "--trainer.enable_progress_bar",
        "false",
        *extra,
    ]
    env = dict(os.environ)
    if core is not None:
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        cmd = ["taskset", "-c", str(core), *cmd]
    start = time.perf_counter()
    with open(save / f"{name}.log", "w") as log:
        subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
    done.write_text(f"{time.perf_counter() - start}\n")
    return float(done.read_text())


def _rows(metrics: Path, key: str) -> list[tuple[int, float]]:
    return [(int(r["step"]), float(r[key])) for r in csv.DictReader(metrics.open()) if r.get(key)]


def run(track: str, seed: int, out: Path, extra: list[str], core: int | None) -> dict:
    save = out / f"seed{seed}"
    save.mkdir(parents=True, exist_ok=True)
    sft_s = _stage(track, "sft", seed, save, [], core)
    sft_run = save / "runs" / f"qwen3_{track}_sft"
    grpo_args = ["--model.model", str(sft_run), *extra]
    grpo_s = _stage(track, "grpo", seed, save, grpo_args, core)
    sft_acc = _rows(next(sft_run.glob("version_*/metrics.csv")), "val/accuracy")
    held_out = _rows(next((save / "runs" / f"qwen3_{track}_grpo").glob("version_*/metrics.csv")), "val/greedy_accuracy")
    test = test_split(ROOT / stages(track)["grpo"][-1], seed, save / "runs", grpo_args, core)["test/greedy_accuracy"]
    return {
        "seed": seed,
        "sft_steps": sft_acc[-1][0] + 1,
        "sft_dev": sft_acc[-1][1],
        "sft_s": sft_s,
        "grpo_s": grpo_s,
        "start": held_out[0][1],
        "end": held_out[-1][1],
        "best": max(v for _, v in held_out),
        "curve": held_out,
        "test": test,
    }


def table(results: list[dict]) -> str:
    lines = [
        "| seed (= init) | SFT steps | SFT dev accuracy at stop | dev, GRPO step 0 | dev, end (best) | **test**, end | "
        "SFT + GRPO wall time, min | dev curve (step: accuracy) |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        curve = ", ".join(f"{s}: {v:.2f}" for s, v in r["curve"])
        lines.append(
            f"| {r['seed']} | {r['sft_steps']} | {r['sft_dev']:.2f} | {r['start']:.2f} | {r['end']:.2f} ({r['best']:.2f}) "
            f"| **{r['test']:.2f}** | {r['sft_s'] / 60:.1f} + {r['grpo_s'] / 60:.1f} | {curve} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--track", choices=TRACKS, default="tool")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="default: runs/qwen3-<track>-seeds")
    parser.add_argument(
        "--write", action="store_true", help="write the table into docs/evidence/qwen3.md (qwen3-<track>-results)"
    )
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    out = args.out or ROOT / "runs" / f"qwen3-{args.track}-seeds"
    machine = machine_line(threads_note(args.jobs))  # before the runs: no table without its machine
    results = map_on_cores(lambda seed, core: run(args.track, seed, out, extra, core), args.seeds, args.jobs)
    text = table(results)
    print(machine)
    print(text)
    if args.write:
        write_learning_table(ROOT / "docs" / "evidence" / "qwen3.md", marker(args.track), text, machine)


if __name__ == "__main__":
    main()
