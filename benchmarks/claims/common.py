"""Shared pieces of the claim scripts: run a recipe with overrides for several seeds, read the
logged metrics back, plot curves side by side and write a section of docs/evidence/claims.md.

Each run is ``python -m lightning_grpo fit -c <recipe>`` in a subprocess (the recipe is
recipes/quickstart.yaml with the claim's overrides merged in, written next to the run), so a
claim measures exactly what a user of the CLI gets. After training, ``lightning-grpo test`` of the
run's last checkpoint gives the held-out figure (``test/greedy_accuracy``: the test split, prompts no
setting was chosen on); ``val/greedy_accuracy`` is the dev split (the validation prompts).
"""

from __future__ import annotations

import copy
import csv
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CLAIMS_MD = ROOT / "docs" / "evidence" / "claims.md"
PLOTS = ROOT / "docs" / "evidence" / "claims"
sys.path.insert(0, str(ROOT / "benchmarks"))
from quickstart_seeds import forget_test, test_checkpoint  # noqa: E402 - after the sys.path insert


def merge(base: dict, overrides: dict) -> dict:
    """Deep-merge ``overrides`` into a copy of ``base`` (dicts merge, everything else replaces)."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def recipe(overrides: dict, base: str = "recipes/quickstart.yaml") -> dict:
    return merge(yaml.safe_load((ROOT / base).read_text()), overrides)


def callbacks_with(config: dict, *extra: dict) -> list[dict]:
    """The recipe's callbacks plus ``extra`` (class_path / init_args dicts)."""
    return [*config["trainer"]["callbacks"], *extra]


def run(config: dict, seed: int, out: Path) -> dict[str, list[tuple[int, float]]]:
    """Train ``config`` with ``seed`` under ``out`` (skipped when its metrics exist), then test its last
    checkpoint (cached in ``out/test_metrics.json``); returns every logged column as ``[(step, value), ...]``,
    ``test/greedy_accuracy`` as ``[(last step, value)]`` and ``wall_s``."""
    out.mkdir(parents=True, exist_ok=True)
    metrics = out / "metrics.csv"
    path = out / "config.yaml"
    if not metrics.exists():
        forget_test(out)  # a new run replaces the checkpoint the cached test figures came from
        config = merge(
            config,
            {
                "seed_everything": seed,
                "trainer": {
                    "logger": {
                        "class_path": "lightning.pytorch.loggers.CSVLogger",
                        "init_args": {"save_dir": str(out), "name": "", "version": ""},
                    }
                },
            },
        )
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "lightning_grpo", "fit", "-c", str(path)], cwd=ROOT, capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise RuntimeError(f"run {out} failed:\n{proc.stderr[-4000:]}")
        (out / "wall_s.txt").write_text(f"{time.perf_counter() - start:.1f}\n")
    columns = read(metrics)
    test = test_checkpoint(path, out / "checkpoints" / "last.ckpt", out, [])["test/greedy_accuracy"]
    columns["test/greedy_accuracy"] = [(max(step for c in columns.values() for step, _ in c), test)]
    return columns


def read(metrics: Path) -> dict[str, list[tuple[int, float]]]:
    columns: dict[str, list[tuple[int, float]]] = {}
    for row in csv.DictReader(metrics.open()):
        for key, value in row.items():
            if key != "step" and value not in ("", None):
                columns.setdefault(key, []).append((int(row["step"]), float(value)))
    wall = metrics.parent / "wall_s.txt"
    columns["wall_s"] = [(0, float(wall.read_text()))] if wall.exists() else []
    return columns


def final(curve: list[tuple[int, float]]) -> float:
    return curve[-1][1] if curve else float("nan")


def tail_mean(curve: list[tuple[int, float]], frac: float = 0.1) -> float:
    """Mean of the last ``frac`` of a logged curve."""
    if not curve:
        return float("nan")
    n = max(1, int(len(curve) * frac))
    return sum(v for _, v in curve[-n:]) / n


def plot(runs: dict[str, dict[int, dict]], panels: list[tuple[str, str]], path: Path, smooth: int = 5) -> None:
    """One panel per (column, title); one line per (arm, seed), arms in colours, seeds in styles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.3))
    styles = ["-", "--", ":"]
    for ax, (column, title) in zip(axes, panels):
        for color, (arm, seeds) in zip(["C0", "C1", "C2", "C3"], runs.items()):
            for i, (seed, cols) in enumerate(sorted(seeds.items())):
                curve = cols.get(column, [])
                if not curve:
                    continue
                steps, values = zip(*curve)
                k = smooth if len(values) > 3 * smooth and not column.startswith("val/") else 1
                values = [
                    sum(values[max(0, j - k + 1) : j + 1]) / len(values[max(0, j - k + 1) : j + 1])
                    for j in range(len(values))
                ]
                ax.plot(
                    steps,
                    values,
                    styles[i % 3],
                    color=color,
                    lw=1,
                    marker="o" if column.startswith("val/") else None,
                    ms=3,
                    label=f"{arm}, seed {seed}",
                )
        ax.set(title=title, xlabel="optimizer step")
    save_figure(fig, axes, path)


def save_figure(fig: Any, axes: Any, path: Path) -> None:
    """Grid on every panel, legend on the first, then write ``path`` (directories made) and close."""
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=6)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)


def write_section(name: str, text: str) -> None:
    """Replace (or append) the section between ``<!-- claim:name -->`` markers in docs/evidence/claims.md."""
    marker = f"<!-- claim:{name} -->"
    doc = CLAIMS_MD.read_text() if CLAIMS_MD.exists() else "# The seeds' claims in miniature\n"
    if marker in doc:
        head, _, rest = doc.partition(marker)
        _, _, tail = rest.partition(marker)
    else:
        head, tail = doc.rstrip("\n") + "\n\n", "\n"
    CLAIMS_MD.write_text(f"{head}{marker}\n{text.strip()}\n{marker}{tail}")


def args(description: str):
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "claims")
    parser.add_argument("--write", action="store_true", help="write the section and plot into docs/evidence/")
    return parser.parse_args()
