"""Claim: GSPO (sequence-level ratios) vs token-level ratios with several updates per batch.

GSPO paper (Zheng et al. 2025, arXiv 2507.18071): clipping whole sequences clips far more
tokens than GRPO's token clip (about 15% vs 0.1%), yet trains more efficiently and stably.
Arms, on the quickstart recipe with num_iterations 4 (four passes over each generation batch,
so the ratios leave 1): ``token`` (policy_loss ppo, eps 0.2, token_mean) and ``gspo``
(policy_loss gspo, eps 3e-4 / 4e-4, seq_mean_token_mean, the recipe's), 3 seeds.

    python benchmarks/claims/gspo.py --write
"""

from __future__ import annotations

from common import PLOTS, args, final, plot, recipe, run, tail_mean, write_section


def configs() -> dict[str, dict]:
    token = {"policy_loss": "ppo", "policy_loss_args": {"eps_low": 0.2, "eps_high": 0.2}, "aggregation": "token_mean"}
    gspo = {
        "policy_loss": "gspo",
        "policy_loss_args": {"eps_low": 3e-4, "eps_high": 4e-4},
        "aggregation": "seq_mean_token_mean",
    }
    return {
        arm: recipe({"model": {"algorithm": {"num_iterations": 4}, "loss": {"init_args": loss}}})
        for arm, loss in (("token", token), ("gspo", gspo))
    }


def clip_frac(cols: dict) -> float:
    """Mean over the run of clip_frac_low + clip_frac_high (fraction of tokens clipped)."""
    low, high = cols.get("train/clip_frac_low", []), cols.get("train/clip_frac_high", [])
    return sum(v for _, v in low + high) / max(1, len(low))


def main() -> None:
    a = args(__doc__)
    runs = {arm: {s: run(cfg, s, a.out / "gspo" / arm / f"seed{s}") for s in a.seeds} for arm, cfg in configs().items()}
    rows = [
        "| seed | arm | tokens clipped (run mean) | reward, last tenth | dev greedy accuracy, end | "
        "**test** greedy accuracy, end |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    wins = dev_wins = 0
    for s in a.seeds:
        for arm in runs:
            cols = runs[arm][s]
            rows.append(
                f"| {s} | {arm} | {clip_frac(cols):.2%} | {tail_mean(cols['train/reward_mean']):.3f} | "
                f"{final(cols['val/greedy_accuracy']):.2f} | **{final(cols['test/greedy_accuracy']):.2f}** |"
            )
        wins += final(runs["gspo"][s]["test/greedy_accuracy"]) >= final(runs["token"][s]["test/greedy_accuracy"])
        dev_wins += final(runs["gspo"][s]["val/greedy_accuracy"]) >= final(runs["token"][s]["val/greedy_accuracy"])
    ratios = [clip_frac(runs["gspo"][s]) / clip_frac(runs["token"][s]) for s in a.seeds]
    table = "\n".join(rows)
    print(table)
    print(f"gspo ends at least as high on {wins}/{len(a.seeds)} seeds (test), {dev_wins} (dev)")
    if a.write:
        plot(
            runs,
            [
                ("train/clip_frac_high", "clip fraction (high side)"),
                ("train/reward_mean", "training reward"),
                ("val/greedy_accuracy", "dev greedy accuracy"),
            ],
            PLOTS / "gspo.png",
        )
        write_section(
            "gspo",
            SECTION.format(
                table=table, wins=wins, dev_wins=dev_wins, n=len(a.seeds), low=min(ratios), high=max(ratios)
            ),
        )


SECTION = """
## GSPO: sequence-level vs token-level ratios, four updates per batch

**Claim** (GSPO paper): a sequence-level ratio clips far more tokens than
the token-level clip (the paper: about 15% vs 0.1%) yet learns at least as well, because
token-level ratios accumulate noise. **Setup**: the quickstart with `num_iterations: 4`;
`token` = ppo, eps 0.2, token_mean; `gspo` = gspo, eps 3e-4 / 4e-4, seq_mean_token_mean. Held-out:
**test** = greedy accuracy of each run's last checkpoint on the 50 test prompts (none trained on or
used for any choice), the verdict's figure; dev = the 50 validation prompts.
`python benchmarks/claims/gspo.py --write`.

{table}

**Measured**: GSPO ends at least as high as the token-level loss on the test split on {wins} of {n}
seeds (dev: {dev_wins} of {n}; each run's dev and test figures are equal here), with
{low:.0f} to {high:.0f} times as many tokens clipped. Our token-level clip fraction (2-3%) is higher than
the paper's 0.1%: four passes over a batch at lr 1e-3 move the ratios far on this tiny model.
On seed 0 both arms learn less in 1000 steps (250 generations) than the quickstart with one pass
(test and dev 0.90, docs/evidence/learning.md). Each seed has its own initialisation of the tiny model (`seed_everything`); on
seed 2 GSPO ends at 0.20 against the token-level loss's 0.50. **Verdict: reproduced on 2 of 3
seeds** (more clipping on every seed, at least as good test accuracy on seeds 0 and 1; the dev split
agrees).

![gspo](claims/gspo.png)
"""


if __name__ == "__main__":
    main()
