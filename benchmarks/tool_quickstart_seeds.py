"""Run the tool quickstart (recipes/tool_quickstart.yaml) for several seeds, with the tool and
without it (the control: ``agent.environment_args.tools_enabled: false``), and measure what it learns.

Per run: wall time of the whole command, dev success (greedy episodes on the 50 validation prompts,
each with its own secret digit, checked during the run) at step 0 and at the end, the test success
and tool-call rate of the run's last checkpoint (``lightning-grpo test``: 50 episodes from the test
seed stream, which no setting was chosen on; docs/evidence/tuning.md), and the training reward of the first
and last tenth of the steps. Writes a markdown table (docs/evidence/learning.md, between the tool-quickstart
markers, with ``--write``).

    python benchmarks/tool_quickstart_seeds.py --seeds 0 1 2 --jobs 2 --write

With ``--jobs N`` up to N runs go at once, each pinned to its own CPU core (one thread), so each
run's wall time is that of a run alone on one core.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from quickstart_seeds import (
    FIXED_ORDER,
    forget_test,
    machine_line,
    newest,
    test_split,
    threads_note,
    write_learning_table,
)

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "tool_quickstart.yaml"
RESULTS = "<!-- tool-quickstart-results -->"


def recipe(out: Path, tools: bool) -> Path:
    """The recipe as shipped, or its copy with the tool disabled (the control)."""
    if tools:
        return RECIPE
    cfg = yaml.safe_load(RECIPE.read_text())
    cfg["rollout"]["init_args"]["agent"]["environment_args"]["tools_enabled"] = False
    path = out / "tool_quickstart_control.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def run(seed: int, out: Path, tools: bool, extra: list[str], core: int | None = None) -> dict:
    save = out / f"{'tools' if tools else 'control'}-seed{seed}"
    forget_test(save)
    cmd = [
        sys.executable,
        "-m",
        "lightning_grpo",
        "fit",
        "-c",
        str(recipe(out, tools)),
        "--seed_everything",
        str(seed),
        *FIXED_ORDER,
        "--trainer.logger.init_args.save_dir",
        str(save),
        *extra,
    ]
    env = dict(os.environ)
    if core is not None:  # one core (util-linux taskset), one thread
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        cmd = ["taskset", "-c", str(core), *cmd]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    rows = list(csv.DictReader(newest(save.glob("tool_quickstart/version_*/metrics.csv")).open()))
    test = test_split(recipe(out, tools), seed, save, extra, core, name="tool_quickstart")
    reward = [float(r["train/reward_mean"]) for r in rows if r.get("train/reward_mean")]
    val = [r for r in rows if r.get("val/greedy_accuracy")]
    tenth = max(1, len(reward) // 10)
    return {
        "seed": seed,
        "tools": tools,
        "wall_s": wall,
        "reward_first": sum(reward[:tenth]) / tenth,
        "reward_last": sum(reward[-tenth:]) / tenth,
        "success_start": float(val[0]["val/greedy_accuracy"]),
        "success_end": float(val[-1]["val/greedy_accuracy"]),
        "tool_rate_end": float(val[-1]["val/tool_call_rate"]),
        "test": test["test/greedy_accuracy"],
        "test_tool_rate": test["test/tool_call_rate"],
    }


def table(results: list[dict]) -> str:
    lines = [
        "| run | seed | wall time (s) | dev success, step 0 -> end | dev tool-call rate, end | **test** success, end "
        "| test tool-call rate, end | train reward, first -> last tenth |",
        "|---|---:|---:|---|---:|---:|---:|---|",
    ]
    for r in results:
        lines.append(
            f"| {'tool' if r['tools'] else 'control (no tool)'} | {r['seed']} | {r['wall_s']:.0f} | "
            f"{r['success_start']:.2f} -> {r['success_end']:.2f} | {r['tool_rate_end']:.2f} | **{r['test']:.2f}** | "
            f"{r['test_tool_rate']:.2f} | {r['reward_first']:.3f} -> {r['reward_last']:.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "tool-quickstart-seeds")
    parser.add_argument("--no-control", action="store_true", help="skip the runs without the tool")
    parser.add_argument("--write", action="store_true", help="write the table into docs/evidence/learning.md")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, each pinned to its own core (<= CPU count)")
    parser.add_argument("extra", nargs="*", help="more CLI overrides, after --")
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    if not 1 <= args.jobs <= len(cores):
        parser.error(f"--jobs must be between 1 and the {len(cores)} usable CPU cores, got {args.jobs}")
    runs = [(seed, True) for seed in args.seeds] + ([] if args.no_control else [(seed, False) for seed in args.seeds])
    free = list(cores[: args.jobs]) if args.jobs > 1 else [None]

    def one(spec: tuple[int, bool]) -> dict:
        core = free.pop()  # each worker thread holds one core while its run lasts
        try:
            return run(spec[0], args.out, spec[1], args.extra, core)
        finally:
            free.append(core)

    machine = machine_line(threads_note(args.jobs))  # before the runs: no table without its machine
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(one, runs))
    text = table(results)
    print(machine)
    print(text)
    if args.write:
        write_learning_table(ROOT / "docs" / "evidence" / "learning.md", RESULTS, text, machine)


if __name__ == "__main__":
    main()
