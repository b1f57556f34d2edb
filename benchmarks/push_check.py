"""What the weight push check costs, and what a healthy float32 push gives on its probe.

Trains with the in-process vLLM engine and ``rollout.weight_sync.check_every: 1`` (a check after every push)
and times, per step, the step (wall time between two generation starts) and the check (engine score + trainer
forward of the probe). The healthy mean / max |dlogp| are the check's own comparisons.

    python benchmarks/push_check.py --shape quickstart --steps 30     # recipes/quickstart.yaml's shape
    python benchmarks/push_check.py --shape long --steps 4            # 512-token prompts, 256 new tokens (long_shape.py)

Each shape runs in its own process; prints one JSON line (``RESULT {...}``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

SHAPES = {
    # prompts x G, new tokens, prompt tokens (0: the digit task), model size of bench_step.py, lr
    "quickstart": dict(prompts=8, max_new_tokens=2, prompt_tokens=0, size="tiny", lr=1e-3),
    "long": dict(prompts=4, max_new_tokens=256, prompt_tokens=512, size="10m", lr=1e-6),
}


def run(shape: str, steps: int) -> dict:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    import lightning as L
    import torch

    from bench_step import size_config
    from lightning_grpo import GRPOModule, RewardSpec, RolloutCallback, SamplingConfig, VLLMArgs
    from lightning_grpo.callbacks import push_check
    from lightning_grpo.callbacks.settings import WeightSyncSettings
    from long_shape import datamodule, kv_cache_bytes, model_dir

    spec = SHAPES[shape]
    path = str(model_dir(size_config(spec["size"]), spec["prompt_tokens"], spec["max_new_tokens"]))
    checks, gaps, starts, probe = [], [], [], []
    verify = push_check.PushCheck.verify

    def timed_after_push(self, engine, module, step):
        start = time.perf_counter()
        judged = self.prepare(module, step)
        if judged is not None:
            expected = judged[0]
            probe[:] = [len(s) for s in self.probe]
            for scores in engine.score(self.probe).values():
                diffs = torch.cat([(s - e).abs() for s, e in zip(scores, expected.logp)])
                gaps.append((float(diffs.mean()), float(diffs.max())))
            verify(self, engine, *judged)
            checks.append(time.perf_counter() - start)

    push_check.PushCheck.after_push = timed_after_push  # the check itself, timed whole; its extra score: not

    class StepTimer(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            starts.append(time.perf_counter())

    max_len = max(128, 1 << (spec["prompt_tokens"] + spec["max_new_tokens"] - 1).bit_length())
    kv_bytes = max(64 * 2**20, 2 * kv_cache_bytes(path, spec["prompts"] * 8, max_len))
    callback = RolloutCallback(
        engine=VLLMArgs(dtype="float32", max_model_len=max_len, kv_cache_memory_bytes=kv_bytes),
        sampling=SamplingConfig(n=8, max_new_tokens=spec["max_new_tokens"]),
        rewards=[RewardSpec("prefix_match")],
        weight_sync=WeightSyncSettings(check_every=1),
        seed=0,
    )
    module = GRPOModule(model=path, optimizer=lambda p: torch.optim.AdamW(p, lr=spec["lr"]))
    trainer = L.Trainer(
        max_steps=steps,
        callbacks=[callback, StepTimer()],
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(module, datamodule=datamodule(path, spec["prompts"], spec["prompt_tokens"], steps))
    step_times = [b - a for a, b in zip(starts, starts[1:])][2:]  # the first steps warm up
    step, check = statistics.median(step_times), statistics.median(checks[1:] or checks)
    return {
        "shape": shape,
        "params": sum(p.numel() for p in module.policy.parameters()),
        "probe_tokens": probe,
        "steps": steps,
        "checks": len(checks),
        "step_ms": 1000 * step,
        "check_ms": 1000 * check,
        "share_every_push": check / step,
        "every_for_2pct": max(1, -(-check // (0.02 * step))),
        "healthy_mean_abs_max": max(g[0] for g in gaps),
        "healthy_max_abs_max": max(g[1] for g in gaps),
        "threads": torch.get_num_threads(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="quickstart")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    print("RESULT " + json.dumps(run(args.shape, args.steps)))


if __name__ == "__main__":
    main()
