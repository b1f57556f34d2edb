"""Shared-prefix forwards vs padded and packed ones on long prompts: the training phase of one
micro-batch (policy log-probs + GRPO loss + backward + AdamW step) and the no-grad log-prob pass
(reference / old log-probs), at about 10M parameters.

    python benchmarks/bench_prefix.py --write     # results into docs/evidence/benchmarks.md
    python benchmarks/bench_prefix.py --shapes 512:8 --rounds 3

A micro-batch holds ``--rows`` rows: rows / G groups, each one prompt of P tokens sampled G times.
Completion lengths are drawn log-uniformly from [4, 256] (mean / max about 0.2, as in
bench_packing.py), one row of the batch at 256. Layouts (GRPOModule ``packing`` / ``prefix_sharing``):
padded (off / off), packed (on / off), shared (off / on: one prompt segment per row), shared + packed
(on / on); all four alternate in every round (``--rounds`` after one warm-up), medians and min-max.

On a CUDA machine, ``--model qwen2.5-0.5b`` runs a random-init Qwen2.5-0.5B (benchmarks/gpu_check.py's
configuration) on the GPU with float32 weights under bf16 autocast (the ``bf16-mixed`` trainer), timings
synchronised with the device, sdpa attention (the shared layout's 4D mask needs sdpa or eager):

    python benchmarks/bench_prefix.py --model qwen2.5-0.5b --shapes 512:8 2048:8 --write
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_packing import log_uniform_lengths, timed
from bench_step import SIZES, versions, write_section

SECTION = "## Shared-prefix forwards: long prompts"
CUDA_SECTION = "## Shared-prefix forwards on CUDA"
LAYOUTS = {"padded": ("off", "off"), "packed": ("on", "off"), "shared": ("off", "on"), "shared+packed": ("on", "on")}


def grouped_batch(prompt: int, group: int, rows: int, vocab: int, seed: int, max_len: int = 256):
    """``rows`` rows of ``rows // group`` prompts of ``prompt`` tokens, ragged completions in [4, max_len]."""
    from lightning_grpo.core.batch import RolloutBatch

    gen = torch.Generator().manual_seed(seed)
    comp = log_uniform_lengths(rows, 4, max_len, gen)
    ids = torch.zeros(rows, prompt + max_len, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for b in range(rows):
        if b % group == 0:
            prompt_ids = torch.randint(5, vocab, (prompt,), generator=gen)
        ids[b, :prompt], ids[b, prompt : prompt + comp[b]] = (
            prompt_ids,
            torch.randint(5, vocab, (comp[b],), generator=gen),
        )
        attn[b, : prompt + comp[b]] = 1
    batch = RolloutBatch(
        input_ids=ids,
        attention_mask=attn,
        completion_mask=attn[:, prompt:].float(),
        advantages=torch.randn(rows, generator=gen),
        rollout_logp=torch.zeros(rows, max_len),
        prompt_length=prompt,
        group_size=group,
        temperature=1.0,
    )
    return batch, sum(comp) / len(comp)


def measure(policy, batch, rounds: int, autocast=None) -> tuple[dict, dict]:
    """{(phase, layout): [seconds per round]}, and each layout's slots (rows x width) and auto's pick.
    ``autocast``: a context factory the forwards run under (mixed precision), none by default."""
    from contextlib import nullcontext

    from lightning_grpo import ForwardSettings, GRPOModule
    from lightning_grpo.training.prefix import SharedPrefixPlan, choose_layout

    autocast = autocast or nullcontext

    modules = {
        name: GRPOModule(model=policy, forward=ForwardSettings(packing=p, prefix_sharing=s))
        for name, (p, s) in LAYOUTS.items()
    }
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-6)
    total, seqs = batch.completion_mask.sum(), torch.tensor(float(len(batch)))

    def train(module):
        with autocast():
            out = module.token_logprobs(policy, batch, compute_entropy=True)
        module.loss_fn(
            out.logp, batch.completion_mask, batch.advantages, entropy=out.entropy, num_tokens=total, num_sequences=seqs
        ).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def no_grad(module):
        with torch.no_grad(), autocast():
            module.token_logprobs(policy, batch)

    slots = {}
    for name, (p, s) in LAYOUTS.items():
        plan = choose_layout(policy, batch, p, s)
        slots[name] = batch.input_ids.numel() if plan is None else plan.rows * plan.width
    auto = choose_layout(policy, batch, "auto", "auto")
    slots["auto"] = "padded" if auto is None else ("shared+packed" if isinstance(auto, SharedPrefixPlan) else "packed")
    times = {(kind, name): [] for kind in ("train", "no_grad") for name in modules}
    order = list(modules.items())
    for r in range(rounds + 1):  # round 0 warms up
        for kind, fn in (("train", train), ("no_grad", no_grad)):
            for name, module in order if r % 2 else order[::-1]:
                t = timed(partial(fn, module))
                if r:
                    times[(kind, name)].append(t)
    return times, slots


def load_policy(model: str):
    """(policy in train mode, autocast factory or None, a description for the table)."""
    from transformers import AutoModelForCausalLM

    if model == "10m":
        from lightning_grpo.models.tiny import TinyModelConfig, tiny_model_dir

        path = tiny_model_dir(TinyModelConfig(**SIZES["10m"], max_position_embeddings=4096))
        policy = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="sdpa").train()
        params = sum(p.numel() for p in policy.parameters())
        return policy, None, f"{params / 1e6:.1f}M-parameter Qwen2 (hidden 384, 5 layers), float32"
    from gpu_check import ROOT as GPU_ROOT, build_model

    if not torch.cuda.is_available():
        raise SystemExit(f"--model {model} runs on a CUDA device; this machine has none")
    path = build_model(model, GPU_ROOT / "runs" / "gpu-check-models")
    policy = (
        AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="sdpa", dtype=torch.float32).cuda().train()
    )

    def autocast() -> torch.autocast:
        return torch.autocast("cuda", dtype=torch.bfloat16)

    return policy, autocast, f"random-init {model} (float32 weights, bf16 autocast as the bf16-mixed trainer)"


def machine_name(device: torch.device) -> str:
    return f"{torch.cuda.get_device_name(device)}" if device.type == "cuda" else f"{cpu_name()}, 2 cores"


def cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    names = (
        [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")]
        if cpuinfo.exists()
        else []
    )
    return names[0] if names else platform.processor() or platform.machine()


def cell(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--shapes", nargs="+", default=["128:8", "128:16", "512:8", "512:16", "2048:8", "2048:16"], help="PROMPT:G"
    )
    parser.add_argument("--rows", type=int, default=16, help="rows of the micro-batch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write", action="store_true")
    parser.add_argument(
        "--load", default="nothing else running", help="what else ran on the machine (for the table's note)"
    )
    parser.add_argument(
        "--model",
        default="10m",
        choices=["10m", "qwen2.5-0.5b", "qwen2.5-1.5b"],
        help="10m: the CPU table's model; a Qwen2.5 size: random-init, on CUDA, bf16 autocast",
    )
    args = parser.parse_args()
    policy, autocast, described = load_policy(args.model)
    device = next(policy.parameters()).device
    lines = [
        SECTION if device.type == "cpu" else CUDA_SECTION,
        "",
        f"One micro-batch of {args.rows} rows (rows / G prompts of P tokens, G samples each), completion lengths "
        f"log-uniform in [4, 256], one at 256 (mean in the table, mean / max about 0.2), {described}, sdpa "
        f"attention. Train = policy log-probs + GRPO loss + backward + AdamW; no-grad = "
        f"the reference / old log-prob pass. The four layouts alternate, {args.rounds} rounds after a warm-up round; "
        f"median (min-max) seconds; slots = rows x width of the forward. Machine: {machine_name(device)}, "
        f"{args.load}; {versions()}.",
        "",
        f"Command: `python benchmarks/bench_prefix.py --shapes {' '.join(args.shapes)} --rows {args.rows} "
        f"--rounds {args.rounds}{'' if args.model == '10m' else f' --model {args.model}'} --write`",
        "",
        "| P | G | mean completion | layout | slots | train (s) | vs padded | vs packed | no-grad (s) | vs padded | auto picks |",
        "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for shape in args.shapes:
        prompt, group = map(int, shape.split(":"))
        batch, mean = grouped_batch(prompt, group, args.rows, policy.config.vocab_size, seed=0)
        times, slots = measure(policy, batch.to(device), args.rounds, autocast)
        med = {key: statistics.median(v) for key, v in times.items()}
        for name in LAYOUTS:
            train, nograd = times[("train", name)], times[("no_grad", name)]
            lines.append(
                f"| {prompt} | {group} | {mean:.0f} | {name} | {slots[name]} | {cell(train)} | "
                f"{med[('train', name)] / med[('train', 'padded')]:.2f} | {med[('train', name)] / med[('train', 'packed')]:.2f} | "
                f"{cell(nograd)} | {med[('no_grad', name)] / med[('no_grad', 'padded')]:.2f} | "
                f"{slots['auto'] if name == 'padded' else ''} |"
            )
        print("\n".join(lines[-len(LAYOUTS) :]), flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        write_section(text, lines[0])


if __name__ == "__main__":
    main()
