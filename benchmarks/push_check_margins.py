"""The weight push check's margins on a real run: the noise it calibrates, and each check's d_new and d_old.

Runs ``lightning-grpo`` with the given arguments (add ``--rollout.weight_sync.check_every 1`` to check every
push) and prints, per check and per copy of the engine's weights, the engine's mean |dlogp| to the trainer's
scores of the probe under the pushed weights (d_new) and under the previous push's (d_old), how far the step moved the trainer's own scores (d_step), the engine's distance to the nearest earlier
scores kept (d_earlier: the probe's, the last passed check's) and the rule's verdict (`push_check.judge`), then one
JSON line (``RESULT {...}``): the noise, the tolerance, the largest d_new / noise, the smallest d_old / d_new and the
verdicts counted. Nothing stops the run: the check only measures here.

    python benchmarks/push_check_margins.py fit -c recipes/quickstart.yaml --trainer.max_steps 30 \\
        --rollout.weight_sync.check_every 1 --trainer.limit_val_batches 0
"""

from __future__ import annotations

import json
import sys

from lightning_grpo.callbacks import push_check
from lightning_grpo.callbacks.push_check import Gaps, PushCheck

CHECKS: list[dict] = []
NOISE: dict[str, float] = {}
calibrate, verify, judge = PushCheck.calibrate, PushCheck.verify, push_check.judge
AT: dict[str, int] = {}  # the weights version of the check under way


def calibrated(check: PushCheck, engine) -> None:
    calibrate(check, engine)
    NOISE.update(noise=check.noise, tolerance=check.current_tolerance())


def verifying(check: PushCheck, engine, expected, previous) -> None:
    AT["step"] = expected.step
    verify(check, engine, expected, previous)


def recorded(gaps: Gaps, tolerance: float, noise_limit: float) -> str:
    """The rule's verdict, recorded and printed; the run goes on whatever it is."""
    verdict = judge(gaps, tolerance, noise_limit)
    CHECKS.append(dict(at=AT["step"], verdict=verdict, **vars(gaps)))
    print(
        f"push check at step {AT['step']}: d_new {gaps.new:.3g}, d_old {gaps.old:.3g}, d_step {gaps.step:.3g}, "
        f"d_earlier {gaps.earlier:.3g}: {verdict}"
    )
    return "landed"


def summary() -> dict:
    moved = [c["old"] / c["new"] for c in CHECKS if c["new"] > 0]
    noise = NOISE.get("noise") or 0.0
    return {
        **NOISE,
        "checks": len(CHECKS),
        **{v: sum(c["verdict"] == v for c in CHECKS) for v in ("landed", "hidden", "failed")},
        "d_new_max": max((c["new"] for c in CHECKS), default=None),
        "d_new_over_noise_max": max(c["new"] for c in CHECKS) / noise if CHECKS and noise else None,
        "d_earlier_over_d_new_min": min((c["earlier"] / c["new"] for c in CHECKS if c["new"] > 0), default=None),
        "d_old_over_d_new_min": min(moved, default=None),
    }


def main() -> None:
    PushCheck.calibrate, PushCheck.verify, push_check.judge = calibrated, verifying, recorded
    from lightning_grpo.cli import main as cli

    try:
        cli(sys.argv[1:])
    finally:
        print("RESULT " + json.dumps(summary()))


if __name__ == "__main__":
    main()
