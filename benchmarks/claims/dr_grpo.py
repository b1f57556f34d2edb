"""Claim: Dr.GRPO's length bias. With ``seq_mean_token_mean`` (each sequence's loss divided by
its own length), wrong answers grow longer than with ``seq_mean_token_sum_norm`` (a constant
divisor, number of sequences x max_new_tokens).

Dr.GRPO paper (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv 2503.20783): the
1/|o_i| normaliser gives a long wrong answer a smaller per-token penalty than a short one, so
the policy drifts towards long wrong answers; Dr.GRPO removes it. Arms, on the quickstart recipe
with the ``count_to_last`` rule (``"4823="`` -> ``"0123"``, answers of 1 to 10 characters),
``exact_match`` reward and max_new_tokens 24, the same ``grpo`` advantage in both (only the
aggregation differs), 3 seeds.

    python benchmarks/claims/dr_grpo.py --write
"""

from __future__ import annotations

from common import PLOTS, args, final, plot, recipe, run, tail_mean, write_section

MAX_NEW_TOKENS = 24
STEPS = 400
ARMS = ("seq_mean_token_mean", "seq_mean_token_sum_norm")


def configs() -> dict[str, dict]:
    out = {}
    for arm in ARMS:
        loss = {"aggregation": arm}
        if arm == "seq_mean_token_sum_norm":
            loss["aggregation_args"] = {"max_length": MAX_NEW_TOKENS}
        task = {"class_path": "lightning_grpo.DigitTask", "init_args": {"rule": "count_to_last"}}
        config = recipe(
            {
                "trainer": {"max_steps": STEPS, "val_check_interval": STEPS // 4},
                "model": {"loss": {"init_args": loss}},
                "data": {"source": task},
            }
        )
        rollout = config["rollout"]
        rollout["sampling"]["max_new_tokens"] = MAX_NEW_TOKENS
        rollout["rewards"] = [{"name": "exact_match"}]
        out[arm] = config
    return out


def mean(curve: list[tuple[int, float]], lo: int, hi: int) -> float:
    """Mean of a logged curve over steps ``lo <= step < hi``."""
    values = [v for step, v in curve if lo <= step < hi]
    return sum(values) / len(values) if values else float("nan")


def main() -> None:
    a = args(__doc__)
    runs = {
        arm: {s: run(cfg, s, a.out / "dr_grpo" / arm / f"seed{s}") for s in a.seeds} for arm, cfg in configs().items()
    }
    rows = [
        "| seed | arm | wrong length, first tenth | wrong length, run mean | wrong length, last tenth | all completions, last tenth | reward, last tenth | dev greedy accuracy, end | "
        "**test** greedy accuracy, end |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    longer = longer_run = 0
    for s in a.seeds:
        for arm in runs:
            cols = runs[arm][s]
            wrong = cols["train/completion_length_wrong_mean"]
            rows.append(
                f"| {s} | {arm} | {mean(wrong, 0, STEPS // 10):.2f} | {mean(wrong, 0, STEPS):.2f} | {tail_mean(wrong):.2f} | "
                f"{tail_mean(cols['train/completion_length_mean']):.2f} | {tail_mean(cols['train/reward_mean']):.3f} | "
                f"{final(cols['val/greedy_accuracy']):.2f} | **{final(cols['test/greedy_accuracy']):.2f}** |"
            )
        ends = {arm: tail_mean(runs[arm][s]["train/completion_length_wrong_mean"]) for arm in runs}
        longer += ends["seq_mean_token_mean"] > ends["seq_mean_token_sum_norm"]
        whole = {arm: mean(runs[arm][s]["train/completion_length_wrong_mean"], 0, STEPS) for arm in runs}
        longer_run += whole["seq_mean_token_mean"] > whole["seq_mean_token_sum_norm"]
    table = "\n".join(rows)
    print(table)
    print(
        f"seq_mean_token_mean has longer wrong answers on {longer}/{len(a.seeds)} seeds (last tenth), "
        f"{longer_run}/{len(a.seeds)} (run mean)"
    )
    if a.write:
        plot(
            runs,
            [
                ("train/completion_length_wrong_mean", "length of wrong completions (tokens)"),
                ("train/reward_mean", "training reward"),
                ("val/greedy_accuracy", "dev greedy accuracy"),
            ],
            PLOTS / "dr_grpo.png",
        )
        write_section("dr_grpo", SECTION.format(table=table, longer=longer, longer_run=longer_run, n=len(a.seeds)))


SECTION = """
## Dr.GRPO: length of wrong answers, per-sequence vs constant normaliser

**Claim** (Dr.GRPO, Liu et al. 2025, arXiv 2503.20783): dividing each sequence's loss by its own
length (`seq_mean_token_mean`, the original GRPO) penalises a long wrong answer less per token
than a short one, so wrong answers grow longer during training; a constant normaliser
(`seq_mean_token_sum_norm`, N_seq x max_new_tokens) removes the bias and keeps them short.
**Setup**: the quickstart with the task rule `count_to_last` (`4823=` -> `0123`, answers of 1 to
10 characters), reward `exact_match`, max_new_tokens 24, 400 steps; the same `grpo` advantage in
both arms, only the aggregation differs. "Wrong length" is `train/completion_length_wrong_mean`,
the mean length in tokens (EOS included) of the sampled completions with reward 0, logged every
10 steps. `python benchmarks/claims/dr_grpo.py --write`.

{table}

**Measured**: `seq_mean_token_mean` has the longer wrong answers in the last tenth on {longer} of
{n} seeds, and over the whole run on {longer_run} of {n}. In both arms and on every seed the
wrong answers get *shorter*, from about 19 tokens (the random policy rarely samples EOS) toward 2
(one character and EOS): the only answers random sampling finds right are the shortest (`0`,
right on the 10% of prompts ending in 0), so the positive advantages pull the policy to the
one-character answer `0` (greedy accuracy 0.10 on the dev and the test split alike = the share of
their prompts ending in 0). With `seq_mean_token_mean` that collapse comes on every seed, the wrong
answers staying at 2.2 tokens or fewer from step 160 / 270 / 290 on (seeds 0 / 1 / 2; entropy
0.04-0.09 at the end). With `seq_mean_token_sum_norm` it comes later on every seed: from step 350 on
seed 0 (entropy 0.16 at the end), not quite within the 400 steps on seed 1 (wrong answers 2.3 tokens
at the end, entropy 0.83), and not on seed 2, whose wrong answers are still 9.4 tokens long in the
last tenth (entropy 3.2, reward 0, dev and test 0.08). So the constant normaliser keeps the wrong
answers *longer* over the whole run on every seed, the opposite of the claim. Each seed has its own
initialisation of the tiny model (`seed_everything`). The held-out columns: **test** = the 50 test
prompts (none trained on or used for any choice), dev = the 50 validation prompts; no accuracy
figure enters this claim's verdict, which is about lengths.
Neither arm learns the rule in 400 steps, so the regime the paper describes (a policy that learns
while its wrong answers lengthen) is not reached here.
**Verdict: not reproduced** (no arm's wrong answers grow; the per-sequence normaliser shortens
them sooner, not later).

![dr grpo](claims/dr_grpo.png)
"""


if __name__ == "__main__":
    main()
