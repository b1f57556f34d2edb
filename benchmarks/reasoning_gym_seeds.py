"""Run the reasoning-gym quickstart (recipes/reasoning_gym_quickstart.yaml) for several seeds and
measure what it learns: the machinery of benchmarks/quickstart_seeds.py (wall time, training reward
of the first and last tenth, held-out greedy accuracy at step 0 and at the end, guard alarms).

The training reward is spell_backward's own partial credit (letters in place / 3); the held-out
greedy accuracy is the share of the 50 held-out words (never trained on) spelled backward exactly.

    python benchmarks/reasoning_gym_seeds.py --seeds 0 1 2 --jobs 2 --write

``--write`` puts the table into docs/evidence/learning.md between the ``<!-- reasoning_gym_quickstart-results -->``
markers and the curves into docs/evidence/reasoning_gym_quickstart_curve.png. With ``--jobs 2`` two runs go
at once, each pinned to its own CPU core (one thread), so each wall time is that of a run alone on
one core (of a machine other work may share).
"""

from __future__ import annotations

from quickstart_seeds import ROOT, arguments, run_and_report


def main() -> None:
    args = arguments(ROOT / "recipes" / "reasoning_gym_quickstart.yaml", __doc__).parse_args()
    run_and_report(args)


if __name__ == "__main__":
    main()
