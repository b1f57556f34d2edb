"""What handing a step's metrics to ``LightningModule.log`` costs: a recipe trained with
``trainer.log_every_n_steps`` 1 (every step's ~60 metrics handed over) and 10 (the recipes' value: every 10th
step and the last, `lightning_grpo.training.metrics.hands_step_metrics_over`).

    python benchmarks/bench_logging.py --recipes quickstart tool_quickstart --steps 120

Each run is a ``lightning-grpo fit`` of the recipe as shipped (vLLM in the process, CSV logger, no validation)
in a subprocess; the step time is the median wall time between two training-batch starts after the first 20
steps (and the mean: a handed-over step costs more than the others). Prints one JSON line per run (``RESULT {...}``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning as L

ROOT = Path(__file__).resolve().parents[1]
WARMUP = 20


class StepClock(L.Callback):
    """Appends the time of every training-batch start to ``path`` (one float per line)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        with open(self.path, "a") as f:
            f.write(f"{time.perf_counter()}\n")


def run(recipe: str, steps: int, every: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        clock = Path(tmp) / "clock.txt"
        callback = {"class_path": "bench_logging.StepClock", "init_args": {"path": str(clock)}}
        command = [
            *[sys.executable, "-m", "lightning_grpo", "fit", "-c", str(ROOT / "recipes" / f"{recipe}.yaml")],
            f"--trainer.max_steps={steps}",
            f"--trainer.log_every_n_steps={every}",
            "--trainer.limit_val_batches=0",
            "--trainer.enable_progress_bar=false",
            f"--trainer.logger.init_args.save_dir={tmp}",
            f"--trainer.callbacks+={json.dumps(callback)}",
        ]
        env = {"PYTHONPATH": str(Path(__file__).resolve().parent), "OMP_NUM_THREADS": "1"}
        done = subprocess.run(command, cwd=tmp, capture_output=True, text=True, env={**os.environ, **env})
        if done.returncode != 0:
            raise SystemExit(f"{recipe} (log_every_n_steps {every}) failed:\n{done.stderr[-3000:]}")
        starts = [float(line) for line in clock.read_text().split()]
    gaps = [b - a for a, b in zip(starts, starts[1:])][WARMUP:]
    return {
        "recipe": recipe,
        "log_every_n_steps": every,
        "steps": steps,
        "step_ms_median": 1000 * statistics.median(gaps),
        "step_ms_mean": 1000 * statistics.mean(gaps),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipes", nargs="+", default=["quickstart", "tool_quickstart"])
    parser.add_argument("--steps", type=int, default=120)
    args = parser.parse_args()
    for recipe in args.recipes:
        for every in (1, 10):
            print("RESULT " + json.dumps(run(recipe, args.steps, every)), flush=True)


if __name__ == "__main__":
    main()
