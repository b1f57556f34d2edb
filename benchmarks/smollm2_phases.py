"""Where the time of a real-model step goes on CPU: the per-phase seconds of a run of
recipes/smollm2_arithmetic.yaml (SmolLM2-135M-Instruct, 4 prompts x 8 samples, 96 new tokens), each phase set
against what this CPU can do at best.

    python benchmarks/smollm2_phases.py RUN_FOLDER --cores 0 --write

``RUN_FOLDER`` holds the run's metrics.csv (logged every step: ``--trainer.log_every_n_steps 1``; the lightning-grpo
run of benchmarks/smollm2_vs_trl.py is one). Phases are the medians over steps 6+ of what the rollout callback logs
(``train/time/<phase>``). Two floors, measured here pinned to ``--cores`` with as many threads (run it pinned as the
run was, on a quiet machine):

- training (forward, backward): ``6 x`` the multiply-adds the step cannot skip: the 30 layers' linear weights
  (106.2M) over each prompt once (a group's 8 samples share it: ``forward.prefix_sharing``) and every completion
  token, and the tied output head (28.3M) over the completion tokens only (only their log-probs are needed);
  attention scores add under 0.2% at these lengths and are left out; divided by the float32 matrix-multiply rate
  of this CPU at the model's own shapes (``[T, 576] x [576, 1536]``, ``[T, 576] x [576, 49152]``);
- generation: the prefill of each prompt once (prefix caching), then per generated token the whole model, or per
  decoding step one read of the float32 weights at this CPU's memory copy rate, whichever is slower.

``--write`` puts the table into docs/evidence/performance.md between the ``<!-- smollm2-phases -->`` markers.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
MARKER = "<!-- smollm2-phases -->"
PHASES = ("generate", "reward", "prepare", "sync", "push_check", "train")
#: SmolLM2-135M: hidden 576, MLP 1536, 30 layers, 9 query / 3 key-value heads of 64, vocabulary 49,152 (tied head).
HIDDEN, MLP, LAYERS, KV, VOCAB = 576, 1536, 30, 192, 49152
#: The parameters every token multiplies: per layer q, o (576 x 576), k, v (576 x 192), gate, up, down (576 x 1536);
#: plus the output head (576 x 49152, tied to the embedding).
BODY_PARAMS = LAYERS * (2 * HIDDEN * HIDDEN + 2 * HIDDEN * KV + 3 * HIDDEN * MLP)
HEAD_PARAMS = HIDDEN * VOCAB
MATMUL_PARAMS = BODY_PARAMS + HEAD_PARAMS
WEIGHT_BYTES = 4 * 134_515_008  # float32, every parameter (the embedding is read once as the head)
PROMPTS, SAMPLES = 4, 32  # the recipe's prompts per step and samples (4 x G = 8)


def gemm_rate(tokens: int, repeats: int = 20) -> float:
    """Float32 FLOP/s of this CPU's matrix multiply at the model's widest shapes, forward and backward as in
    training: the best of ``repeats`` for ``[tokens, 576] @ [576, 1536]`` and the head ``[tokens, 576] @ [576, 49152]``,
    weighted by their share of the step's FLOPs."""
    import torch

    x = torch.randn(tokens, HIDDEN)
    rates = []
    for width in (MLP, VOCAB):
        w = torch.randn(HIDDEN, width)
        torch.mm(x, w)  # warm-up: oneDNN picks its kernel on the first call
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(x, w)
            best = min(best, time.perf_counter() - start)
        rates.append(2 * tokens * HIDDEN * width / best)
    head_share = HIDDEN * VOCAB / MATMUL_PARAMS
    return 1 / ((1 - head_share) / rates[0] + head_share / rates[1])


def copy_rate(megabytes: int = 512, repeats: int = 5) -> float:
    """Bytes per second read from memory: the best of ``repeats`` copies of a buffer larger than any cache
    (the copy reads and writes it: 2 x its size moved)."""
    import torch

    src = torch.empty(megabytes * 2**20 // 4)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() * 4 / best


def run_phases(folder: Path) -> dict[str, float]:
    """Medians over steps 6+ of the run's phases, step total, batch tokens and decoding steps."""
    metrics = next(folder.glob("**/metrics.csv"))
    rows = [r for r in csv.DictReader(metrics.open()) if r.get("train/time/train")][5:]
    if len(rows) < 5:
        raise SystemExit(f"{metrics}: fewer than 10 logged steps (log every step: --trainer.log_every_n_steps 1)")
    out = {k: statistics.median(float(r[f"train/time/{k}"] or 0) for r in rows) for k in PHASES}
    out["completion"] = statistics.median(float(r["train/completion_length_mean"]) for r in rows)
    out["decode_steps"] = statistics.median(float(r["train/completion_length_max"]) for r in rows)
    return out


def prompt_tokens() -> float:
    """Mean prompt length of the recipe's training prompts, chat template and system prompt included."""
    from lightning_grpo.cli.app import build_cli

    dm = build_cli(args=["-c", str(ROOT / "recipes/smollm2_arithmetic.yaml")], run=False).datamodule
    dm.setup("fit")
    return statistics.mean(len(r["prompt_ids"]) for g in range(30) for r in dm.generation_prompts(g))


def floors(phases: dict[str, float], prompt: float, gemm: float, copy: float) -> dict[str, float]:
    """The least seconds this CPU needs for the step's generation and training (see the module docstring)."""
    completion = SAMPLES * phases["completion"]  # tokens the step generates and trains on
    distinct = PROMPTS * prompt  # the prompts' tokens, each prompt once (prefix caching, prefix sharing)
    prefill = 2 * BODY_PARAMS * distinct / gemm
    decode = max(2 * MATMUL_PARAMS * completion / gemm, phases["decode_steps"] * WEIGHT_BYTES / copy)
    train = 6 * (BODY_PARAMS * (distinct + completion) + HEAD_PARAMS * completion) / gemm
    return {"generate": prefill + decode, "train": train}


def table(phases: dict[str, float], prompt: float, gemm: float, copy: float) -> str:
    floor = floors(phases, prompt, gemm, copy)
    step = sum(phases[k] for k in PHASES)
    lines = ["| phase | seconds (median) | share of the step | floor on this CPU (s) | measured / floor |"]
    lines.append("|---|---|---|---|---|")
    for name in sorted(PHASES, key=lambda k: -phases[k]):
        cells = (f"{floor[name]:.2f}", f"{phases[name] / floor[name]:.1f}x") if name in floor else ("", "")
        lines.append(f"| {name} | {phases[name]:.2f} | {phases[name] / step:.0%} | {cells[0]} | {cells[1]} |")
    lines.append(f"| step | {step:.2f} | 100% | | |")
    lines += [
        "",
        f"A step: {PROMPTS} prompts of {prompt:.0f} tokens (chat template and system prompt), {SAMPLES} samples of "
        f"{phases['completion']:.1f} tokens (median; the longest {phases['decode_steps']:.0f}). This CPU: "
        f"{gemm / 1e9:.0f} GFLOP/s float32 matrix multiply at the model's shapes, {copy / 1e9:.1f} GB/s memory copy "
        f"({WEIGHT_BYTES / 1e6:.0f} MB of float32 weights).",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="the run's folder (its metrics.csv is found below it)")
    parser.add_argument("--cores", default="0", help="the cores the run was pinned to (the floors are measured so)")
    parser.add_argument("--write", action="store_true", help="write the table into docs/evidence/performance.md")
    args = parser.parse_args()
    cores = [int(c) for c in args.cores.split(",")]
    os.sched_setaffinity(0, cores)
    import torch

    torch.set_num_threads(len(cores))
    phases = run_phases(args.run)
    prompt = prompt_tokens()
    gemm, copy = gemm_rate(int(PROMPTS * prompt + SAMPLES * phases["completion"])), copy_rate()
    text = table(phases, prompt, gemm, copy)
    print(text)
    if args.write:
        from quickstart_seeds import machine_line, write_between_markers

        note = f"the floors measured pinned to core(s) {args.cores}, {len(cores)} thread(s)"
        write_between_markers(ROOT / "docs/evidence/performance.md", MARKER, f"{machine_line(note)}\n\n{text}")


if __name__ == "__main__":
    main()
