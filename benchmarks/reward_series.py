"""Measured per-step training reward of a few recipe runs, for tests/test_reward_drop_guard.py.

Writes tests/fixtures/reward_series.json: for each run its recipe, seed, overrides and
``train/reward_mean`` at every step (``--trainer.log_every_n_steps 1``), each run pinned to one core
with one thread as benchmarks/quickstart_seeds.py runs them. The runs:

- the tool quickstart, seed 1: it learns the tool call, loses it at step 620 (docs/stability.md,
  "A learned behaviour lost in one step") and learns it again at about step 1240;
- the tool quickstart, seed 4, and the quickstart, seeds 0-2: runs that learn and keep it.

Every run starts from the seed-0 initialisation of the built-in model (``--model.model tiny:<variant>@0``),
as every seed did when the series were measured: the seed varies the sampling only.

    python benchmarks/reward_series.py --jobs 2
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from quickstart_seeds import ROOT, run_seeds

#: recipe -> the seeds run with it (fixture names: <recipe>_seed<N>)
RUNS = {"tool_quickstart": [1, 4], "quickstart": [0, 1, 2]}
#: recipe -> its overrides: the built-in model's seed-0 initialisation whatever the run's seed
OVERRIDES = {"tool_quickstart": ["--model.model", "tiny:tools@0"], "quickstart": ["--model.model", "tiny:chars@0"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "reward-series")
    parser.add_argument("--fixture", type=Path, default=ROOT / "tests" / "fixtures" / "reward_series.json")
    parser.add_argument("--reuse", action="store_true", help="read a run finished earlier in --out")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, each pinned to its own core")
    args = parser.parse_args()
    series = {}
    for recipe, seeds in RUNS.items():
        results = run_seeds(seeds, args.out / recipe, ["--trainer.log_every_n_steps", "1", *OVERRIDES[recipe]],
                            ROOT / "recipes" / f"{recipe}.yaml",
                            args.reuse, min(args.jobs, len(seeds)))  # fmt: skip
        for seed, result in zip(seeds, results):
            name, steps = f"{recipe}_seed{seed}", [step for step, _ in result["reward_curve"]]
            assert steps == list(range(len(steps))), f"{name}: not one reward per step"
            series[name] = {"recipe": f"recipes/{recipe}.yaml", "seed": seed, "overrides": OVERRIDES[recipe],
                            "reward_mean": [round(v, 4) for _, v in result["reward_curve"]]}
            print(f"{name}: {len(steps)} steps, reward {series[name]['reward_mean'][0]} -> {series[name]['reward_mean'][-1]}")
    args.fixture.parent.mkdir(parents=True, exist_ok=True)
    args.fixture.write_text(json.dumps(series, separators=(",", ":")) + "\n")
    print(f"wrote {args.fixture.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
