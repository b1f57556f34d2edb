"""Claim: on-policy distillation reaches held-out accuracy in fewer steps than GRPO from reward alone.

Thinking Machines ("On-Policy Distillation", 2025), after Agarwal et al. 2024: a teacher's per-token
reverse-KL signal on the student's own samples is dense where an outcome reward gives one bit per
completion, so the student reaches the teacher's level in a fraction of RL's steps. Arms, 3 seeds,
dev greedy accuracy every 50 steps, test greedy accuracy of each run's last checkpoint:

- ``distill``: recipes/distill_quickstart.yaml (pure OPD, no reward reaches the student, 400 steps);
  the teacher is the quickstart's policy (seed 2), trained here once with SavePretrained.
- ``distill_raw``: the same with ``group_baseline: false``, the peers' raw estimate A_t = -k_t.
- ``grpo``: recipes/quickstart.yaml (the reward alone, 1000 steps).

    python benchmarks/claims/distill.py --write
"""

from __future__ import annotations

from common import PLOTS, args, callbacks_with, final, plot, recipe, run, write_section

TEACHER_SEED = 2
EVERY = {"trainer": {"val_check_interval": 50}}


def teacher(out) -> tuple[str, dict]:
    """The teacher directory (trained once: the quickstart with SavePretrained) and its run's metrics."""
    config = recipe({})
    save = {"class_path": "lightning_grpo.SavePretrained", "init_args": {"dirpath": str(out / "teacher")}}
    config["trainer"]["callbacks"] = callbacks_with(config, save)
    cols = run(config, TEACHER_SEED, out / "teacher_run")
    return str(out / "teacher"), cols


def steps_to(curve: list[tuple[int, float]], level: float = 0.8) -> str:
    """The first evaluated step with dev accuracy >= level (step 0 is the untrained policy)."""
    hit = next((step for step, value in curve if value >= level - 1e-9), None)
    return "not reached" if hit is None else str(hit + 1 if hit else 0)


def _before(a: str, b: str) -> bool:
    """Run a reached 0.8 at an earlier step than run b (or b never did)."""
    return a != "not reached" and (b == "not reached" or int(a) < int(b))


def main() -> None:
    a = args(__doc__)
    out = a.out / "distill"
    path, teacher_cols = teacher(out)
    configs = {
        "distill": recipe(
            {**EVERY, "model": {"distillation": {"teacher": path}}}, base="recipes/distill_quickstart.yaml"
        ),
        "distill_raw": recipe(
            {**EVERY, "model": {"distillation": {"teacher": path, "group_baseline": False}}},
            base="recipes/distill_quickstart.yaml",
        ),
        "grpo": recipe(EVERY),
    }
    runs = {arm: {s: run(cfg, s, out / arm / f"seed{s}") for s in a.seeds} for arm, cfg in configs.items()}
    teacher_acc = final(teacher_cols["val/greedy_accuracy"])
    teacher_test = final(teacher_cols["test/greedy_accuracy"])
    rows = [
        "| seed | arm | steps to dev 0.8 | dev greedy accuracy, end | **test** greedy accuracy, end | teacher's dev / test | "
        "wall time (s) |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    faster = raw_faster = 0
    for s in a.seeds:
        for arm in runs:
            cols = runs[arm][s]
            rows.append(
                f"| {s} | {arm} | {steps_to(cols['val/greedy_accuracy'])} | {final(cols['val/greedy_accuracy']):.2f} | "
                f"**{final(cols['test/greedy_accuracy']):.2f}** | {teacher_acc:.2f} / {teacher_test:.2f} | {final(cols['wall_s']):.0f} |"
            )
        d, r, g = (steps_to(runs[arm][s]["val/greedy_accuracy"]) for arm in ("distill", "distill_raw", "grpo"))
        faster += _before(d, g)
        raw_faster += _before(r, g)
    table = "\n".join(rows)
    print(table)
    print(
        f"distillation reaches dev 0.8 first on {faster}/{len(a.seeds)} seeds (raw estimate: {raw_faster}); teacher dev {teacher_acc:.2f} test {teacher_test:.2f}"
    )
    if a.write:
        plot(
            runs,
            [
                ("train/reward_mean", "training reward (measured only for distill)"),
                ("train/distill_reverse_kl", "reverse KL to the teacher"),
                ("val/greedy_accuracy", "dev greedy accuracy"),
            ],
            PLOTS / "distill.png",
        )
        write_section("distill", SECTION.format(table=table, faster=faster, raw_faster=raw_faster, n=len(a.seeds)))


SECTION = """
## On-policy distillation vs GRPO from the reward alone

**Claim** (Thinking Machines, "On-Policy Distillation", 2025; Agarwal et al. 2024): a teacher's
per-token reverse-KL signal on the student's own samples is dense where an outcome reward gives one
bit per completion, so the student reaches the teacher's level in a fraction of RL's steps.
**Setup**: `distill` = `recipes/distill_quickstart.yaml`: the untrained tiny model learns from the
quickstart's policy (seed 2, saved with `SavePretrained`) with `A_t = -(log pi_student - log
pi_teacher)` and no reward (prefix_match is computed only to measure), minus the mean of the
group's other completions at the same position (`group_baseline`, our variance reduction);
`distill_raw` = the peers' raw estimate (`group_baseline: false`); `grpo` =
`recipes/quickstart.yaml`, the reward alone (1000 steps; the distillation arms 400). Dev = greedy
accuracy on the 50 validation prompts every 50 steps ("steps to dev 0.8" is read on it, the only
accuracy along a run: the recipes keep `last.ckpt` alone); **test** = greedy accuracy of each run's
last checkpoint on the 50 test prompts (none trained on or used for any choice); "teacher's" is the
teacher run's own dev / test accuracy at its end.
`python benchmarks/claims/distill.py --write`.

{table}

**Measured**: distillation with the group baseline reaches dev 0.8 before GRPO on {faster} of
{n} seeds, the peers' raw estimate on {raw_faster} of {n}. With the baseline every student ends at its
teacher (test 1.00 on every seed, as on dev; the teacher's 1.00 / 1.00), at dev 0.8 by step 150-200;
GRPO reaches dev 0.8 at step 200 on seeds 0 and 2 and never on seed 1 (0.70 at the end on both
splits, as in the quickstart's learning table), so on seed 2 the two tie. The raw estimate `A_t = -k_t`
is slower than the baseline on every seed (300 / 300 / 400 steps, ending at test 1.00 / 0.90 / 0.90,
dev 0.98 / 0.90 / 0.90; ahead of GRPO only on seed 1, where GRPO never gets there): the
student starts random, so almost every sampled first token is one the teacher rules out (`k_t`
about +6 nats) and its only signal is to push that token down; GRPO's group-centred reward and the
leave-one-out baseline both concentrate the update on the rare right samples. The claim comes from
students that already start near their teacher, which this random-init tiny model is not. Each
student starts from the initialisation of its own seed (`seed_everything`); the teacher is the
quickstart's seed-2 run, trained from the seed-2 initialisation. Per step, a distillation run costs
about 1.5x a GRPO step here (29-31 s for 400 steps against 50-52 s for 1000, one run at a time with
one thread; the distillation runs also pay the teacher's forward). (When every seed started from
the seed-0 weights, dev split, earlier runs: teacher 0.90, the group baseline first on 1 of 3 seeds; the code before that:
teacher 1.00, first on 2 of 3.)
**Verdict: not reproduced** for the peers' estimator (first only where GRPO never reaches 0.8); with
the group baseline **reproduced on 2 of 3 seeds** (one tie): faster than the raw estimate on every
seed, not reliably faster than GRPO from one initialisation to the next (speed read on the dev
curve; the test split at the end agrees with dev within 0.02 on every run).

![distill](claims/distill.png)
"""


if __name__ == "__main__":
    main()
