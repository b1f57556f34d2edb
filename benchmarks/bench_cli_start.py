"""How long each command takes to answer, against importing Lightning alone, on this machine.

    python benchmarks/bench_cli_start.py --rounds 5 --cores 0 --write

Each command runs ``--rounds`` times in a fresh process, the commands interleaved within a round, pinned to
``--cores``; the figure is the median wall time, and its ratio to ``python -c "import lightning"`` measured in the
same rounds. ``fit --print_config`` of the quickstart stands for a fit's start (parsing the recipe, importing what
training needs, building nothing). ``--write`` puts the table into docs/evidence/benchmarks.md between the
``<!-- cli-start -->`` markers.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
MARKER = "<!-- cli-start -->"
CLI = [sys.executable, "-m", "lightning_grpo"]
COMMANDS = {
    'python -c "import lightning"': [sys.executable, "-c", "import lightning"],
    "lightning-grpo --help": [*CLI, "--help"],
    "lightning-grpo report --help": [*CLI, "report", "--help"],
    "lightning-grpo export --help": [*CLI, "export", "--help"],
    "lightning-grpo fit --help": [*CLI, "fit", "--help"],
    "lightning-grpo fit -c recipes/quickstart.yaml --print_config": [
        *CLI,
        "fit",
        "-c",
        str(ROOT / "recipes/quickstart.yaml"),
        "--print_config",
    ],
}


def seconds(cmd: list[str], cores: str) -> float:
    start = time.perf_counter()
    subprocess.run(["taskset", "-c", cores, *cmd], cwd=ROOT, capture_output=True, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cores", default="0")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.rounds):
        for name, cmd in COMMANDS.items():
            times[name].append(seconds(cmd, args.cores))
    base = statistics.median(times['python -c "import lightning"'])
    lines = ["| command | median seconds | / import lightning |", "|---|---|---|"]
    lines += [f"| `{n}` | {statistics.median(t):.2f} | {statistics.median(t) / base:.2f}x |" for n, t in times.items()]
    text = "\n".join(lines)
    print(text)
    if args.write:
        from quickstart_seeds import machine_line, write_between_markers

        note = f"{args.rounds} rounds, each command a fresh process pinned to core(s) {args.cores}"
        write_between_markers(ROOT / "docs/evidence/benchmarks.md", MARKER, f"{machine_line(note)}\n\n{text}")


if __name__ == "__main__":
    main()
