"""Claim: DAPO Clip-Higher (eps_high 0.28) keeps entropy higher and reaches higher held-out
accuracy than symmetric clipping (0.2) at a learning rate where the latter collapses.

Arms, on the quickstart recipe at lr 2e-3 with steps_per_generation 4 (four optimizer steps per
generation batch, as recipes/dapo.yaml, so the ratio leaves 1 and the clip acts): ``eps_0.2``
and ``eps_0.28`` (eps_low 0.2 in both), 3 seeds.

    python benchmarks/claims/clip_higher.py --write
"""

from __future__ import annotations

from common import PLOTS, args, final, plot, recipe, run, tail_mean, write_section

LR = 2e-3


def configs() -> dict[str, dict]:
    def arm(eps_high: float) -> dict:
        loss = {"policy_loss": "ppo", "policy_loss_args": {"eps_low": 0.2, "eps_high": eps_high}}
        return recipe(
            {
                "model": {
                    "algorithm": {"steps_per_generation": 4},
                    "loss": {"init_args": loss},
                    "optimizer": {"init_args": {"lr": LR}},
                }
            }
        )

    return {"eps_0.2": arm(0.2), "eps_0.28": arm(0.28)}


def main() -> None:
    a = args(__doc__)
    runs = {
        arm: {s: run(cfg, s, a.out / "clip_higher" / arm / f"seed{s}") for s in a.seeds}
        for arm, cfg in configs().items()
    }
    rows = [
        "| seed | arm | entropy, last tenth | clip_frac_high (run mean) | dev greedy accuracy, end | "
        "**test** greedy accuracy, end |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    wins = dev_wins = 0
    for s in a.seeds:
        for arm in runs:
            cols = runs[arm][s]
            high = cols.get("train/clip_frac_high", [])
            rows.append(
                f"| {s} | {arm} | {tail_mean(cols['train/entropy']):.3f} | {sum(v for _, v in high) / max(1, len(high)):.2%} | "
                f"{final(cols['val/greedy_accuracy']):.2f} | **{final(cols['test/greedy_accuracy']):.2f}** |"
            )
        wins += final(runs["eps_0.28"][s]["test/greedy_accuracy"]) > final(runs["eps_0.2"][s]["test/greedy_accuracy"])
        dev_wins += final(runs["eps_0.28"][s]["val/greedy_accuracy"]) > final(runs["eps_0.2"][s]["val/greedy_accuracy"])
    table = "\n".join(rows)
    print(table)
    print(f"eps_high 0.28 ends higher on {wins}/{len(a.seeds)} seeds (test), {dev_wins} (dev)")
    if a.write:
        plot(
            runs,
            [
                ("train/entropy", "token entropy"),
                ("train/reward_mean", "training reward"),
                ("val/greedy_accuracy", "dev greedy accuracy"),
            ],
            PLOTS / "clip_higher.png",
        )
        write_section("clip_higher", SECTION.format(table=table, wins=wins, dev_wins=dev_wins, n=len(a.seeds)))


SECTION = """
## DAPO Clip-Higher at a collapsing learning rate

**Claim** (DAPO, Yu et al. 2025): decoupling the clip range (eps_high 0.28
above eps_low 0.2) lets low-probability tokens grow, keeps entropy higher and reaches higher
accuracy. **Setup**: the quickstart at lr 2e-3 with `steps_per_generation: 4`, eps_high 0.2 vs
0.28. Held-out: **test** = greedy accuracy of each run's last checkpoint on the 50 test prompts
(none trained on or used for any choice), the verdict's figure; dev = the 50 validation prompts.
`python benchmarks/claims/clip_higher.py --write`.

{table}

**Measured**: eps_high 0.28 ends with higher test accuracy on {wins} of {n} seeds (dev: {dev_wins} of {n}). Entropy over
the last tenth is higher with eps_high 0.28 on seed 2 only (0.23 vs 0.15; on seeds 0 and 1 it is
lower, 0.03 vs 0.20 and 0.05 vs 0.18), and neither arm learns the task at this learning rate with
four optimizer steps per batch (test accuracy 0.10-0.24, dev 0.10-0.30; chance is 0.10). The clip fractions
are small (0-0.5% of tokens on the high side). Each seed has its own initialisation of the tiny
model (`seed_everything`); when every seed started from the seed-0 weights, entropy was higher with
eps_high 0.28 on two seeds. **Verdict: not reproduced** (neither entropy nor test accuracy; the dev split agrees).

![clip higher](claims/clip_higher.png)
"""


if __name__ == "__main__":
    main()
