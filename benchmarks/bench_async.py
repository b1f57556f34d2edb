"""Throughput of in-process vs server rollouts, synchronous vs asynchronous (max_staleness 1, 2).

About 10M parameters (Qwen2 shape: hidden 384, 6 layers), 8 prompts x 8 samples, 16 new tokens,
one optimizer step per generation. Rows:

- ``inproc-sync``: ``engine: vllm`` (vLLM in the trainer's process), both cores;
- ``server-sync``: ``engine: vllm_server``, ``max_staleness: 0``, server pinned to core 0, trainer to core 1;
- ``server-async-k``: the same with ``max_staleness: k``.

Each row runs in a fresh subprocess; the clock runs from the start of step ``--warmup`` to the
end of the last step (server start and warm-up excluded). Push time per step: the median of
``time/sync`` (the weight push; in async mode the pushes the worker finished since the last batch).

    python benchmarks/bench_async.py --steps 40 --write     # results into docs/evidence/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPE = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=6, num_key_value_heads=6, intermediate_size=1024)
ROWS = {
    "inproc-sync": ("vllm", 0),
    "server-sync": ("vllm_server", 0),
    "server-async-1": ("vllm_server", 1),
    "server-async-2": ("vllm_server", 2),
}
SECTION = "## Server and asynchronous rollouts: throughput"
PROMPTS, GROUP, NEW_TOKENS = 8, 8, 16


def child(row: str, steps: int, warmup: int) -> None:
    engine, k = ROWS[row]
    pinned = engine == "vllm_server" and os.environ.get("BENCH_PIN", "1") == "1"
    if pinned:  # before torch starts its thread pool: one thread each, trainer on core 1, server on core 0
        os.environ["OMP_NUM_THREADS"] = "1"
        os.sched_setaffinity(0, {1})
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    import lightning as L
    import torch

    from lightning_grpo import (
        GRPOLoss,
        GRPOModule,
        OffPolicySettings,
        PromptDataModule,
        RewardSpec,
        RolloutCallback,
        SamplingConfig,
        ServerLaunch,
        ServerSettings,
        VLLMArgs,
    )
    from lightning_grpo.data.tasks import DigitTask
    from lightning_grpo.models.tiny import TinyModelConfig, tiny_model_dir

    path = str(tiny_model_dir(TinyModelConfig(**SHAPE)))
    args = {"max_model_len": 128, "kv_cache_memory_bytes": 256 * 2**20}
    settings = (
        ServerSettings(**args, launch=ServerLaunch(cpus=[0] if pinned else None)) if engine == "vllm_server" else None
    )
    marks: dict[str, float] = {}
    syncs: list[float] = []
    phases: list[dict] = []

    class Clock(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step == warmup:
                marks["start"] = time.perf_counter()
            if trainer.global_step >= warmup:
                syncs.append(pl_module.rollout_metrics.get("time/sync", 0.0))
                phases.append({k: v for k, v in pl_module.rollout_metrics.items() if k.startswith("time/")})

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            marks["end"] = time.perf_counter()

    callback = RolloutCallback(
        engine=settings or (VLLMArgs(**args) if engine == "vllm" else engine),
        sampling=SamplingConfig(n=GROUP, max_new_tokens=NEW_TOKENS),
        rewards=[RewardSpec("prefix_match")],
        seed=0,
        max_staleness=k,
    )
    loss = (
        GRPOLoss(off_policy=OffPolicySettings(correction="tis_token")) if k else None
    )  # asynchronous batches need the loss's correction
    module = GRPOModule(model=path, loss=loss, optimizer=lambda p: torch.optim.AdamW(p, lr=1e-5))
    trainer = L.Trainer(
        max_steps=steps,
        callbacks=[callback, Clock()],
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        default_root_dir=f"/tmp/bench_async_{row}",
    )
    trainer.fit(module, datamodule=PromptDataModule(DigitTask(), tokenizer_path=path, batch_size=PROMPTS))
    measured = steps - warmup
    seconds = marks["end"] - marks["start"]
    params = sum(p.numel() for p in module.policy.parameters())
    print(
        "RESULT "
        + json.dumps(
            {
                "row": row,
                "seconds": seconds,
                "steps": measured,
                "params": params,
                "push_ms": 1000 * statistics.median(syncs[1:] or [0.0]),
                "phases_ms": {k: 1000 * statistics.median(p.get(k, 0.0) for p in phases[1:]) for k in phases[-1]},
            }
        )
    )


def run_row(row: str, steps: int, warmup: int) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", row, "--steps", str(steps), "--warmup", str(warmup)],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


def table(results: list[dict]) -> str:
    sync = next((r for r in results if r["row"] == "server-sync"), None)
    lines = [
        "| rollout | samples / s | optimizer steps / min | vs server sync | weight push per step (ms) | generate (ms) | train (ms) | wait_rollout (ms) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        rate = r["steps"] * PROMPTS * GROUP / r["seconds"]
        ratio = f"{sync['seconds'] / r['seconds']:.2f}x" if sync else "-"
        ph = r.get("phases_ms", {})
        wait = f"{ph['time/wait_rollout']:.0f}" if "time/wait_rollout" in ph else "-"
        lines.append(
            f"| {r['row']} | {rate:.1f} | {60 * r['steps'] / r['seconds']:.1f} | {ratio} | {r['push_ms']:.1f} | "
            f"{ph.get('time/generate', 0):.0f} | {ph.get('time/train', 0):.0f} | {wait} |"
        )
    return "\n".join(lines)


def write(text: str, results: list[dict], args: argparse.Namespace) -> None:
    import torch
    import vllm

    params = results[0]["params"] / 1e6
    body = (
        f"{SECTION}\n\n{params:.1f}M-parameter Qwen2 (hidden 384, 6 layers), {PROMPTS} prompts x {GROUP} samples, "
        f"{NEW_TOKENS} new tokens, one optimizer step per generation, steps {args.warmup}-{args.steps} timed. "
        f"Machine: {platform.machine()}, {os.cpu_count()} cores; torch {torch.__version__}, vllm {vllm.__version__}. "
        "Server rows: server pinned to core 0, trainer to core 1, one thread each (`OMP_NUM_THREADS=1`); "
        "in-process row: one process, both cores, 2 threads. Phases: medians per step (ms) of the callback's timers "
        "(`wait_rollout`: the trainer waiting for an asynchronous batch).\n\n"
        f"Command: `python benchmarks/bench_async.py --steps {args.steps} --warmup {args.warmup} --write`\n\n{text}\n"
    )
    path = ROOT / "docs" / "evidence" / "benchmarks.md"
    page = path.read_text()
    head, found, rest = page.partition(SECTION)
    tail = rest[rest.find("\n## ") :] if found and "\n## " in rest else ""
    path.write_text((head.rstrip() + "\n\n" if found else page.rstrip() + "\n\n") + body + tail)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", choices=sorted(ROWS))
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=sorted(ROWS))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.steps, args.warmup)
        return
    results = []
    for row in args.rows:
        results.append(run_row(row, args.steps, args.warmup))
        print(json.dumps(results[-1]), flush=True)
    text = table(results)
    print(text)
    if args.write:
        write(text, results, args)


if __name__ == "__main__":
    main()
