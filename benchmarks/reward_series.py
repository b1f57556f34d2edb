"""Measured per-step metrics of recipe runs, to check the guards' defaults on (tests/callbacks/test_reward_drop_guard.py,
tests/callbacks/test_guards_heldout.py).

Two sets, each written to its own fixture, each run pinned to one core with one thread as
benchmarks/quickstart_seeds.py runs them, with ``--trainer.log_every_n_steps 1``:

- ``design`` (tests/fixtures/reward_series.json): the series RewardDropGuard's defaults were chosen on.
  The tool quickstart, seed 1: it learns the tool call, loses it at step 620 (docs/guide/stability.md,
  "A learned behaviour lost in one step") and learns it again at about step 1240; the tool quickstart,
  seed 4, and the quickstart, seeds 0-2: runs that learn and keep it. Every run starts from the seed-0
  initialisation of the built-in model (``--model.model tiny:<variant>@0``), as every seed did when the
  series were measured: the seed varies the sampling only.
- ``heldout`` (tests/fixtures/guard_series_heldout.json): runs no guard default was chosen on, each from
  its own seed's initialisation (the default: the model init follows ``seed_everything``). The tool
  quickstart, seeds 1 and 2 (seed 1 loses the tool call at step 299 and relearns it, seed 2's reward is
  noisy); its control without the tool (reward at chance), seeds 5 and 6; the quickstart, seeds 3-7.

Per run: ``reward_mean`` at every step and, for replaying the guards offline, the other metrics in
:data:`METRICS` (every step), the held-out ``val/reward_mean`` at each validation, and the steps at
which each guard of the recipe fired in the run (``alarms.jsonl``). The design fixture was written
before the other metrics were recorded and holds ``reward_mean`` only.

    python benchmarks/reward_series.py --set design --jobs 2
    taskset -c 0 env OMP_NUM_THREADS=1 python benchmarks/reward_series.py --set heldout
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from quickstart_seeds import ROOT, run_seeds
from tool_quickstart_seeds import recipe as tool_recipe

#: set -> (fixture name, [(run name prefix, recipe name, seeds, overrides)])
SETS = {
    "design": (
        "reward_series.json",
        [
            ("tool_quickstart", "tool_quickstart", [1, 4], ["--model.model", "tiny:tools@0"]),
            ("quickstart", "quickstart", [0, 1, 2], ["--model.model", "tiny:chars@0"]),
        ],
    ),
    "heldout": (
        "guard_series_heldout.json",
        [
            ("tool_quickstart", "tool_quickstart", [1, 2], []),
            ("tool_control", "tool_quickstart_control", [5, 6], []),
            ("quickstart", "quickstart", [3, 4, 5, 6, 7], []),
        ],
    ),
}
#: fixture key -> metrics.csv column, every step (the inputs of the step- and rollout-level guards)
METRICS = {
    "reward_mean": "train/reward_mean",
    "entropy": "train/entropy",
    "frac_reward_zero_std": "train/frac_reward_zero_std",
    "frac_groups_all_lowest": "train/frac_groups_all_lowest",
    "reward_levels": "train/reward_levels",
    "mismatch_k3": "train/mismatch_k3",
    "frac_identical_groups": "train/frac_identical_groups",  # an upper bound of IdenticalSamplesGuard's share
    "completion_length_mean": "train/completion_length_mean",
    "tool_call_rate": "train/agent/tool_call_rate",  # agent recipes only
}


def recipe_path(name: str, out: Path) -> Path:
    """The recipe file: ``tool_quickstart_control`` is the tool quickstart without the tool."""
    return tool_recipe(out, tools=False) if name == "tool_quickstart_control" else ROOT / "recipes" / f"{name}.yaml"


def read_run(save: Path, full: bool) -> dict:
    """One run's series from ``save``'s metrics.csv (every metric of :data:`METRICS` when ``full``) and alarms."""
    metrics = next(save.glob("**/metrics.csv"))
    rows = list(csv.DictReader(metrics.open()))
    keys = METRICS if full else {"reward_mean": METRICS["reward_mean"]}
    series = {}
    for key, column in keys.items():
        values = {int(r["step"]): float(r[column]) for r in rows if r.get(column)}
        assert list(values) == list(range(len(values))), f"{metrics}: {column} is not logged once per step"
        if values or key == "reward_mean":
            series[key] = [round(v, 4) for v in values.values()]
    if full:
        series["val_reward_mean"] = [
            [int(r["step"]), round(float(r["val/reward_mean"]), 4)] for r in rows if r.get("val/reward_mean")
        ]
        alarms_file = metrics.parent / "alarms.jsonl"
        records = [json.loads(line) for line in alarms_file.open()] if alarms_file.exists() else []
        series["alarms"] = {
            g: sorted({r["step"] for r in records if r["guard"] == g}) for g in {r["guard"] for r in records}
        }
    return series


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", choices=sorted(SETS), default="design", dest="which")
    parser.add_argument(
        "--out", type=Path, default=None, help="default: runs/reward-series (design), runs/guard-series-<set>"
    )
    parser.add_argument("--fixture", type=Path, default=None, help="default: the set's file in tests/fixtures")
    parser.add_argument("--reuse", action="store_true", help="read a run finished earlier in --out")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, each pinned to its own core")
    args = parser.parse_args()
    fixture_name, runs = SETS[args.which]
    out = args.out or ROOT / "runs" / ("reward-series" if args.which == "design" else f"guard-series-{args.which}")
    fixture = args.fixture or ROOT / "tests" / "fixtures" / fixture_name
    series = {}
    for prefix, recipe, seeds, overrides in runs:
        run_out = out / (recipe if args.which == "design" else prefix)
        path = recipe_path(recipe, run_out)
        run_seeds(
            seeds,
            run_out,
            ["--trainer.log_every_n_steps", "1", *overrides],
            path,
            args.reuse,
            min(args.jobs, len(seeds)),
        )
        for seed in seeds:
            name = f"{prefix}_seed{seed}"
            series[name] = {
                "set": args.which,
                "recipe": f"recipes/{recipe}.yaml",
                "seed": seed,
                "overrides": overrides,
                **read_run(run_out / f"seed{seed}", full=args.which != "design"),
            }
            if recipe == "tool_quickstart_control":
                series[name]["recipe"] = "recipes/tool_quickstart.yaml with agent.environment_args.tools_enabled: false"
            rewards = series[name]["reward_mean"]
            print(
                f"{name}: {len(rewards)} steps, reward {rewards[0]} -> {rewards[-1]}, alarms {series[name].get('alarms')}"
            )
    fixture.parent.mkdir(parents=True, exist_ok=True)
    fixture.write_text(json.dumps(series, separators=(",", ":")) + "\n")
    print(f"wrote {fixture}")


if __name__ == "__main__":
    main()
