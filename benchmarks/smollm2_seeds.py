"""Run the real-model recipe (recipes/smollm2_arithmetic.yaml: SmolLM2-135M-Instruct on reasoning-gym's chain_sum)
for several seeds and measure what it learns on the test split, which no setting was chosen on.

For each seed, in its own folder under ``--out``: ``lightning-grpo test`` of the untrained model (before), the
recipe's ``fit`` (its wall time), and ``lightning-grpo test`` of the run's last checkpoint (after). The table gives
test accuracy before -> after, greedy and mean@8, with both answer extractions (strict: "Answer: N"; lenient: the
last number), and the guards that fired during the fit.

    python benchmarks/smollm2_seeds.py --seeds 0 1 2 --write
    python benchmarks/smollm2_seeds.py --seeds 0 1 2 --collect --write   # the table of runs already in --out

``--write`` puts the table into docs/evidence/learning.md between the ``<!-- smollm2_arithmetic-results -->``
markers, under the machine line. Run it alone on the machine: the wall times are those of 2 cores.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import time
from pathlib import Path

from quickstart_seeds import ROOT, machine_line, threads_note, write_learning_table

RECIPE = ROOT / "recipes" / "smollm2_arithmetic.yaml"
MARKER = "<!-- smollm2_arithmetic-results -->"
#: (column heading, metric) of the table, each shown before -> after.
FIGURES = (
    ("greedy strict", "test/greedy/strict"),
    ("greedy lenient", "test/greedy/lenient"),
    ("mean@8 strict", "test/mean@8/strict"),
    ("mean@8 lenient", "test/mean@8/lenient"),
)


def _lightning_grpo(args: list[str], log: Path, cwd: Path) -> None:
    with open(log, "w") as out:
        done = subprocess.run([sys.executable, "-m", "lightning_grpo", *args], cwd=cwd, stdout=out, stderr=out)
    if done.returncode != 0:
        raise SystemExit(f"lightning-grpo {args[0]} failed (exit {done.returncode}); see {log}")


def run_seed(seed: int, folder: Path) -> None:
    """Test before, fit, test after; the fit's wall seconds in ``fit_seconds.txt``."""
    folder.mkdir(parents=True, exist_ok=True)
    common = ["-c", str(RECIPE), "--seed_everything", str(seed), "--trainer.enable_progress_bar", "false"]
    _lightning_grpo(["test", *common, "--trainer.logger.init_args.name", "before"], folder / "before.log", folder)
    start = time.monotonic()
    _lightning_grpo(["fit", *common], folder / "fit.log", folder)
    (folder / "fit_seconds.txt").write_text(f"{time.monotonic() - start:.0f}\n")
    checkpoint = "runs/smollm2_arithmetic/version_0/checkpoints/last.ckpt"
    after = ["test", *common, "--trainer.logger.init_args.name", "after", "--ckpt_path", checkpoint]
    _lightning_grpo(after, folder / "after.log", folder)


def _last_row(path: Path) -> dict[str, float]:
    rows = list(csv.DictReader(path.open()))
    return {k: float(v) for k, v in rows[-1].items() if v}


def collect(seed: int, folder: Path) -> dict:
    """The seed's test figures before and after, fit seconds and the alarms that fired."""
    runs = folder / "runs"
    fit_rows = list(csv.DictReader((runs / "smollm2_arithmetic/version_0/metrics.csv").open()))
    alarms = sorted(
        {
            k.removeprefix("alarm/")
            for r in fit_rows
            for k, v in r.items()
            if k.startswith("alarm/") and v and float(v) > 0
        }
    )
    seconds = folder / "fit_seconds.txt"
    return {
        "seed": seed,
        "before": _last_row(runs / "before/version_0/metrics.csv"),
        "after": _last_row(runs / "after/version_0/metrics.csv"),
        "minutes": float(seconds.read_text()) / 60 if seconds.is_file() else None,
        "alarms": alarms,
    }


def table(results: list[dict]) -> str:
    head = "| seed | " + " | ".join(name for name, _ in FIGURES) + " | strict gain (greedy) | fit minutes | alarms |"
    lines = [head, "|" + "---|" * (len(FIGURES) + 4)]
    for r in results:
        cells = [f"{r['before'][key]:.3f} -> {r['after'][key]:.3f}" for _, key in FIGURES]
        gain = r["after"]["test/greedy/strict"] - r["before"]["test/greedy/strict"]
        minutes = f"{r['minutes']:.1f}" if r["minutes"] is not None else "n/a"
        lines.append(
            f"| {r['seed']} | "
            + " | ".join(cells)
            + f" | **{gain:+.3f}** | {minutes} | {', '.join(r['alarms']) or 'none'} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path("/tmp/smollm2_seeds"))
    parser.add_argument("--collect", action="store_true", help="read the runs already in --out, run nothing")
    parser.add_argument("--write", action="store_true", help="write the table into docs/evidence/learning.md")
    args = parser.parse_args()
    for seed in [] if args.collect else args.seeds:
        run_seed(seed, args.out / f"seed{seed}")
    text = table([collect(seed, args.out / f"seed{seed}") for seed in args.seeds])
    print(text)
    if args.write:
        write_learning_table(ROOT / "docs/evidence/learning.md", MARKER, text, machine_line(threads_note(1)))


if __name__ == "__main__":
    main()
