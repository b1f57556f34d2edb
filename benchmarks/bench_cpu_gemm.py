"""vLLM-CPU linear kernels by model width: oneDNN-packed (repacked at each weight push) vs plain
``F.linear`` (a push is a copy), in the quickstart setting. Backs `VLLMPush.cpu_gemm` "auto".

    python benchmarks/bench_cpu_gemm.py                  # hidden 64 (the quickstart model), 256, 512

Each (width, kernels) pair runs in a fresh subprocess: 30 training steps of 8 prompts x 8
samples, 2 new tokens; prints the medians over steps 6-30 of the step time (push + generate +
reward + training step with its optimizer step) and of the generate and push phases, in ms.
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
STEPS = 30


def child(hidden: int, gemm: str) -> None:
    import os

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    import lightning as L
    import torch

    from lightning_grpo import (
        GRPOModule,
        PromptDataModule,
        RewardSpec,
        RolloutCallback,
        SamplingConfig,
        VLLMArgs,
        VLLMPush,
    )
    from lightning_grpo.data.tasks import DigitTask
    from lightning_grpo.models.tiny import TinyModelConfig, tiny_model_dir

    config = (
        TinyModelConfig()
        if hidden == 64
        else TinyModelConfig(
            hidden_size=hidden,
            num_hidden_layers=4,
            num_attention_heads=hidden // 32,
            num_key_value_heads=hidden // 32,
            intermediate_size=4 * hidden,
        )
    )
    path = str(tiny_model_dir(config))
    rows: list[dict] = []

    class Timer(L.Callback):  # listed after the RolloutCallback: its start includes generation + push
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.start = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            rows.append(
                {
                    "wall": time.perf_counter()
                    - self.start
                    + pl_module.rollout_metrics["time/generate"]
                    + pl_module.rollout_metrics["time/sync"]
                    + pl_module.rollout_metrics["time/reward"],
                    **{k: v for k, v in pl_module.rollout_metrics.items() if k.startswith("time/")},
                }
            )

    settings = VLLMArgs(max_model_len=128, kv_cache_memory_bytes=256 * 2**20, weight_push=VLLMPush(cpu_gemm=gemm))
    callback = RolloutCallback(
        engine=settings,
        sampling=SamplingConfig(n=8, max_new_tokens=2),
        rewards=[RewardSpec("prefix_match")],
        seed=0,
    )
    module = GRPOModule(model=path, optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3))
    trainer = L.Trainer(
        max_steps=STEPS,
        callbacks=[callback, Timer()],
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(module, datamodule=PromptDataModule(DigitTask(), tokenizer_path=path, batch_size=8))
    medians = {k: statistics.median(r[k] for r in rows[5:]) for k in ("wall", "time/generate", "time/sync")}
    print("RESULT " + json.dumps(medians))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", nargs=2, metavar=("HIDDEN", "GEMM"))
    parser.add_argument("--hidden", nargs="+", type=int, default=[64, 256, 512])
    args = parser.parse_args()
    if args.child:
        child(int(args.child[0]), args.child[1])
        return
    print("| hidden | kernels | step (ms) | generate (ms) | weight sync (ms) |")
    print("|---:|---|---:|---:|---:|")
    for hidden in args.hidden:
        for gemm in ("packed", "plain"):
            cmd = [sys.executable, __file__, "--child", str(hidden), gemm]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
            r = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])
            print(
                f"| {hidden} | {gemm} | {r['wall'] * 1e3:.0f} | {r['time/generate'] * 1e3:.1f} | {r['time/sync'] * 1e3:.1f} |"
            )


if __name__ == "__main__":
    main()
