"""Padding-free packing vs the padded forward on ragged completions: the training phase of one
micro-batch (policy log-probs + GRPO loss + backward + AdamW step) and the no-grad log-prob pass
(reference / old log-probs), at about 10M parameters.

    python benchmarks/bench_packing.py --write     # results into docs/evidence/benchmarks.md

Completion lengths are drawn log-uniformly from [4, 256] (many short, a few long: mean / max
about 0.25, like real RL batches), prompts 16-32 tokens. Padded and packed runs alternate
(``--rounds`` rounds, medians and min-max spread); the same batch for both.
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import time
from functools import partial
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Padding-free packing: ragged completions"
MODEL = dict(hidden_size=384, num_hidden_layers=5, num_attention_heads=6, num_key_value_heads=6, intermediate_size=1152)


def log_uniform_lengths(rows: int, min_len: int, max_len: int, gen: torch.Generator) -> list[int]:
    """``rows`` completion lengths drawn log-uniformly from [min_len, max_len], the first one max_len
    (the batch is padded to the longest completion)."""
    log_lo, log_hi = math.log(min_len), math.log(max_len)
    comp = [int(round(math.exp(log_lo + (log_hi - log_lo) * float(u)))) for u in torch.rand(rows, generator=gen)]
    comp[0] = max_len
    return comp


def ragged_batch(rows: int, vocab: int, min_len: int, max_len: int, seed: int):
    from lightning_grpo.core.batch import RolloutBatch

    gen = torch.Generator().manual_seed(seed)
    comp = log_uniform_lengths(rows, min_len, max_len, gen)
    prompt = torch.randint(16, 33, (rows,), generator=gen).tolist()
    Lp, Lc = max(prompt), max(comp)
    attn = torch.zeros(rows, Lp + Lc, dtype=torch.long)
    for b in range(rows):
        attn[b, Lp - prompt[b] : Lp + comp[b]] = 1
    ids = torch.randint(5, vocab, attn.shape, generator=gen) * attn
    batch = RolloutBatch(
        input_ids=ids,
        attention_mask=attn,
        completion_mask=attn[:, Lp:].float(),
        advantages=torch.randn(rows, generator=gen),
        rollout_logp=torch.zeros(rows, Lc),
        prompt_length=Lp,
        group_size=8,
        temperature=1.0,
    )
    return batch, sum(comp) / len(comp) / max(comp)


def timed(fn) -> float:
    """Seconds of ``fn()``, the device's queued work included (CUDA)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=16, help="rows of the micro-batch")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    from lightning_grpo import ForwardSettings, GRPOModule
    from lightning_grpo.models.tiny import TinyModelConfig, tiny_model_dir
    from lightning_grpo.training.packing import PackPlan

    policy = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir(TinyModelConfig(**MODEL)))).train()
    params = sum(p.numel() for p in policy.parameters())
    batch, mean_over_max = ragged_batch(args.rows, policy.config.vocab_size, 4, 256, seed=0)
    plan = PackPlan.from_mask(batch.attention_mask, batch.prompt_length)
    modules = {mode: GRPOModule(model=policy, forward=ForwardSettings(packing=mode)) for mode in ("off", "on")}
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-6)
    total = batch.completion_mask.sum()

    def train(module):
        out = module.token_logprobs(policy, batch, compute_entropy=True)
        result = module.loss_fn(
            out.logp,
            batch.completion_mask,
            batch.advantages,
            entropy=out.entropy,
            num_tokens=total,
            num_sequences=torch.tensor(float(len(batch))),
        )
        result.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def no_grad(module):
        with torch.no_grad():
            module.token_logprobs(policy, batch)

    times = {(kind, mode): [] for kind in ("train", "no_grad") for mode in modules}
    for r in range(args.rounds + 1):  # round 0 warms up
        for kind, fn in (("train", train), ("no_grad", no_grad)):
            for mode, module in modules.items() if r % 2 else reversed(modules.items()):
                t = timed(partial(fn, module))
                if r:
                    times[(kind, mode)].append(t)
    lines = [
        SECTION,
        "",
        f"One micro-batch of {args.rows} rows, completion lengths log-uniform in [4, 256] (mean / max "
        f"{mean_over_max:.2f}), prompts 16-32 tokens, {params / 1e6:.1f}M-parameter Qwen2 (hidden 384, 5 layers), "
        f"float32, sdpa attention. Padded: {batch.input_ids.numel()} token slots; packed: {plan.rows} rows x {plan.width} "
        f"= {plan.rows * plan.width} slots ({plan.share:.2f}) for {plan.tokens} real tokens. Padded and packed runs "
        f"alternate, {args.rounds} rounds after one warm-up round; median (min-max) seconds. "
        f"Machine: {platform.machine()}, 2 cores; torch {torch.__version__}.",
        "",
        f"Command: `python benchmarks/bench_packing.py --rows {args.rows} --rounds {args.rounds} --write`",
        "",
        "| phase | padded (s) | packed (s) | packed / padded |",
        "|---|---:|---:|---:|",
    ]
    for kind, label in (
        ("train", "train (log-probs + loss + backward + AdamW)"),
        ("no_grad", "no-grad log-probs (ref / old)"),
    ):
        pad, pack = times[(kind, "off")], times[(kind, "on")]
        lines.append(
            f"| {label} | {statistics.median(pad):.3f} ({min(pad):.3f}-{max(pad):.3f}) | "
            f"{statistics.median(pack):.3f} ({min(pack):.3f}-{max(pack):.3f}) | {statistics.median(pack) / statistics.median(pad):.2f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        path = ROOT / "docs" / "evidence" / "benchmarks.md"
        doc = path.read_text()
        head, found, rest = doc.partition(SECTION)
        tail = rest[rest.find("\n## ") :] if found and "\n## " in rest else ""
        path.write_text(head.rstrip() + "\n\n" + text + tail)


if __name__ == "__main__":
    main()
