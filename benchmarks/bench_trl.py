"""Step time against TRL's GRPOTrainer on the same work: the ~10M-parameter Qwen2 of
bench_step.py ("10m"), the built-in digit-task prompts, 8 prompts x G = 8, 64 new tokens,
temperature 1, AdamW (lr 1e-4), beta 0, one optimizer step per generation, token-mean loss.

    PYTHONPATH=/tmp/trl-pkgs python benchmarks/bench_trl.py --runs ours-hf trl-hf ours-vllm --rounds 3

TRL is not a dependency: install it apart (``pip install --no-deps --target /tmp/trl-pkgs
trl==1.16.0``, the venv already has accelerate and datasets) and put it on PYTHONPATH. Each run is
a fresh subprocess of ``--steps`` steps; runs alternate in the order given, ``--rounds`` times; the
figure per run is the median step time over steps ``--skip``+1 .. ``--steps`` (wall time between two
step ends; includes generation, reward, log-probs, forward, backward, optimizer, logging). Ours
comes from ``bench_step.py --profile`` (its per-step wall time), TRL's from a TrainerCallback.
``trl-vllm`` is TRL's vLLM colocate mode.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_step import SIZES  # noqa: E402

MAX_NEW, PROMPTS, G, LR = 64, 8, 8, 1e-4  # the digit-task defaults; --prompt-tokens etc. for the long shape
ROLLOUT = ("sync", "generate", "reward", "prepare", "rollout_rest")  # ours; the rest is the training batch


def trl_child(steps: int, vllm: bool, out: Path, shape: argparse.Namespace) -> None:
    import os

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # TRL builds its LLM without enforce_eager: vLLM then compiles, which TORCHDYNAMO_DISABLE forbids
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "0" if vllm else "1")
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from long_shape import datamodule, model_dir

    from lightning_grpo.data.rewards import prefix_match

    path = str(model_dir(SIZES["10m"], shape.prompt_tokens, shape.max_new))
    tokenizer = AutoTokenizer.from_pretrained(path)
    dm = datamodule(path, shape.prompts, shape.prompt_tokens, steps)
    dm.setup("fit")
    rows = [r for g in range(steps) for r in dm.generation_prompts(g)]  # the prompts ours samples, in order
    data = Dataset.from_list([{"prompt": tokenizer.decode(r["prompt_ids"]), "answer": r["answer"]} for r in rows])
    ends, lengths = [], []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            ends.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs:
                lengths.append(logs["completions/mean_length"])

    config = GRPOConfig(
        output_dir=str(out / "trl-out"), max_steps=steps, per_device_train_batch_size=shape.prompts * G, num_generations=G,
        max_completion_length=shape.max_new, temperature=1.0, top_p=1.0, top_k=0, learning_rate=shape.lr, beta=0.0,
        num_iterations=1, steps_per_generation=1, gradient_accumulation_steps=1, loss_type="dapo",
        shuffle_dataset=False, use_cpu=True, bf16=False, fp16=False, logging_steps=1, save_strategy="no",
        report_to="none", disable_tqdm=True, seed=0, dataloader_num_workers=0, lr_scheduler_type="constant",
        weight_decay=0.01, max_grad_norm=0.0, use_vllm=vllm,
        **(dict(vllm_mode="colocate", vllm_max_model_length=max(128, shape.prompt_tokens + shape.max_new), vllm_gpu_memory_utilization=0.1) if vllm else {}),
    )  # fmt: skip
    trainer = GRPOTrainer(model=path, reward_funcs=[prefix_match], args=config, train_dataset=data,
                          processing_class=tokenizer, callbacks=[Clock()])  # fmt: skip
    rollout: list[float] = []  # generation + rewards + log-probs, TRL's _generate_and_score_completions
    original = trainer._generate_and_score_completions

    def timed(*a, **k):
        start = time.perf_counter()
        out = original(*a, **k)
        rollout.append(time.perf_counter() - start)
        return out

    trainer._generate_and_score_completions = timed
    trainer.train()
    steps_s = [b - a for a, b in zip(ends, ends[1:])]
    phases = [{"rollout": g, "rest": t - g} for g, t in zip(rollout[1:], steps_s)]
    print("RESULT " + json.dumps({"steps": steps_s, "phases": phases, "length": statistics.mean(lengths) if lengths else None}))


def ours(engine: str, steps: int, packing: str, shape: argparse.Namespace) -> dict:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_step.py"), "--child", engine, "10m", "--steps", str(steps),
           "--max-new-tokens", str(shape.max_new), "--prompts", str(shape.prompts), "--profile", "--packing", packing,
           "--prompt-tokens", str(shape.prompt_tokens), "--lr", str(shape.lr)]  # fmt: skip
    rows = _result(cmd)["rows"]
    phases = [{"rollout": sum(r[k] for k in ROLLOUT), "rest": r["wall"] - sum(r[k] for k in ROLLOUT), **r} for r in rows[1:]]
    return {"steps": [r["wall"] for r in rows[1:]], "phases": phases, "length": statistics.mean(r["length"] for r in rows)}


def _result(cmd: list[str]) -> dict:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"{cmd[2:4]} failed (rc {proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}")
    return json.loads(lines[0][7:])


def run(name: str, steps: int, out: Path, shape: argparse.Namespace) -> dict:
    if name.startswith("ours-"):  # ours-ENGINE or ours-ENGINE-nopack
        engine, _, nopack = name[5:].partition("-")
        return ours(engine, steps, "off" if nopack else "auto", shape)
    return _result([sys.executable, __file__, "--trl-child", name, "--steps", str(steps), "--out", str(out),
                    *shape_args(shape)])  # fmt: skip


def shape_args(shape: argparse.Namespace) -> list[str]:
    return ["--prompt-tokens", str(shape.prompt_tokens), "--max-new", str(shape.max_new), "--prompts", str(shape.prompts),
            "--lr", str(shape.lr)]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", nargs="+", default=["ours-hf", "trl-hf", "ours-vllm"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--skip", type=int, default=4, help="warm-up steps left out of the median")
    parser.add_argument("--trl-child", choices=["trl-hf", "trl-vllm"])
    parser.add_argument("--out", default="/tmp/bench-trl")
    parser.add_argument("--prompt-tokens", type=int, default=0, help="long_shape.py prompts of this many tokens (0: digit task)")
    parser.add_argument("--max-new", type=int, default=MAX_NEW)
    parser.add_argument("--prompts", type=int, default=PROMPTS)
    parser.add_argument("--lr", type=float, default=LR)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.trl_child:
        trl_child(args.steps, args.trl_child == "trl-vllm", out, args)
        return
    medians: dict[str, list[float]] = {name: [] for name in args.runs}
    phase_medians: dict[str, list[dict]] = {name: [] for name in args.runs}
    for r in range(args.rounds):
        for name in args.runs:
            try:
                result = run(name, args.steps, out, args)
            except RuntimeError as err:
                print(f"round {r} {name}: FAILED\n{err}", flush=True)
                continue
            median = statistics.median(result["steps"][args.skip - 1 :])
            medians[name].append(median)
            kept = result["phases"][args.skip - 1 :]
            phase_medians[name].append({k: statistics.median(p[k] for p in kept) for k in kept[0]})
            print(f"round {r} {name}: median step {median:.3f} s, completion length {result['length']}", flush=True)
    print(json.dumps({"step_medians": medians, "phase_medians": phase_medians}))
    for name, values in medians.items():
        if values:
            print(f"{name}: median {statistics.median(values):.3f} s over {len(values)} runs, "
                  f"spread {min(values):.3f}-{max(values):.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
