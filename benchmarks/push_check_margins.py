"""The weight push check's margins on a real run: the noise it calibrates, and each check's d_new and d_old.

Runs ``lightning-grpo`` with the given arguments (add ``--rollout.weight_sync.check_every 1`` to check every
push) and prints, per check and per copy of the engine's weights, the engine's mean |dlogp| to the trainer's
scores of the probe under the pushed weights (d_new) and under the previous push's (d_old), whether the rule
passes it, then one JSON line (``RESULT {...}``): the noise, the tolerance, the largest d_new / noise and the
smallest d_old / d_new. Nothing stops the run: the check only measures here.

    python benchmarks/push_check_margins.py fit -c recipes/quickstart.yaml --trainer.max_steps 30 \\
        --rollout.weight_sync.check_every 1 --trainer.limit_val_batches 0
"""

from __future__ import annotations

import json
import sys

from lightning_grpo.callbacks import push_check
from lightning_grpo.callbacks.push_check import CLOSER, PushCheck, mean_gap

CHECKS: list[dict] = []
NOISE: dict[str, float] = {}
calibrate = PushCheck.calibrate


def calibrated(check: PushCheck, engine) -> None:
    calibrate(check, engine)
    NOISE.update(noise=check.noise, tolerance=check.current_tolerance())


def measured(check: PushCheck, engine, expected, previous) -> None:
    for copy, scores in engine.score(check.probe).items():
        d_new, d_old = mean_gap(scores, expected.logp), mean_gap(scores, previous.logp)
        passes = d_new <= check.current_tolerance() or d_new * CLOSER <= d_old
        CHECKS.append(dict(step=expected.step, copy=copy, d_new=d_new, d_old=d_old, passes=passes))
        print(f"push check at step {expected.step} ({copy}): d_new {d_new:.3g}, d_old {d_old:.3g}, passes {passes}")


def summary() -> dict:
    moved = [c["d_old"] / c["d_new"] for c in CHECKS if c["d_new"] > 0]
    noise = NOISE.get("noise") or 0.0
    return {
        **NOISE,
        "checks": len(CHECKS),
        "failed": sum(not c["passes"] for c in CHECKS),
        "d_new_max": max((c["d_new"] for c in CHECKS), default=None),
        "d_new_over_noise_max": max(c["d_new"] for c in CHECKS) / noise if CHECKS and noise else None,
        "d_old_over_d_new_min": min(moved, default=None),
    }


def main() -> None:
    push_check.PushCheck.calibrate, push_check.PushCheck.verify = calibrated, measured
    from lightning_grpo.cli import main as cli

    try:
        cli(sys.argv[1:])
    finally:
        print("RESULT " + json.dumps(summary()))


if __name__ == "__main__":
    main()
