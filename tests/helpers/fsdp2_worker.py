"""A standalone script that trains GRPOModule sharded with FSDP2 (Lightning ``ModelParallelStrategy``,
2 CPU processes, gloo); driven by tests/e2e/test_fsdp2.py like tests/helpers/distributed_worker.py (Lightning's
launcher re-executes this script for rank 1). It runs the modes it is given in order, in one pair of ranks;
each rank writes ``OUT/<mode>-rank<r>.pt``.

1. ``update``: one SGD step on the fixed rollout halves of tests/helpers/distributed_worker.py (rank r
   trains half r) through the default chunked log-prob path; saves the full (gathered) weights,
   which the test compares with a 1-process update on the concatenated batch, and writes the
   distributed checkpoint ``OUT/update.ckpt`` (a folder) that the test exports.
2. ``e2e``: a few steps of the full loop with an in-process vLLM engine on each rank; after every
   generation (the engine got the weights gathered from the shards after the previous step) it
   records the gap between the engine's log-probs and the sharded policy's.
3. ``prefix``: the ``update`` step on halves whose rows share their prompt (but the left-padded
   one), once with ``prefix_sharing="off"`` and once "on"; saves both gathered updates.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.utils.data import DataLoader

from lightning_grpo import ForwardSettings
from lightning_grpo.data.datamodule import GenerationTicks
from lightning_grpo.models.fsdp import fsdp_units
from tests.helpers.distributed_worker import WORLD, _module, digit_fraction, rollout_half


def _trainer(steps: int, callbacks: list) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        devices=WORLD,
        strategy=ModelParallelStrategy(data_parallel_size=WORLD, tensor_parallel_size=1),
        max_steps=steps,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )


def _full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone() for k, v in model.state_dict().items()
    }


def _sharding(module) -> dict:
    policy = module.policy
    return {
        "units": len(fsdp_units(policy)),
        "dtensor_params": sum(hasattr(p, "full_tensor") for p in policy.parameters()),
        "params": sum(1 for _ in policy.parameters()),
        "chunked_forward_registered": "_grpo_logprob_forward" in policy.__dict__,
    }


def run_update(model_dir: str, out: Path) -> None:
    module = _module(model_dir, "token_mean")
    rank = int(os.environ.get("LOCAL_RANK", 0))
    module.use_rollout(rollout_half(rank, module.policy.config.vocab_size))
    trainer = _trainer(1, [])
    trainer.fit(module, train_dataloaders=DataLoader(GenerationTicks(1, 1), batch_size=None))
    result = {
        "rank": trainer.global_rank,
        "world": trainer.world_size,
        "step": trainer.global_step,
        **_sharding(module),
    }
    result["state"] = _full_state(module.policy)
    trainer.save_checkpoint(
        out / "update.ckpt"
    )  # every rank: a distributed checkpoint folder (lightning-grpo export reads it)
    torch.save(result, out / f"update-rank{trainer.global_rank}.pt")


def run_prefix(model_dir: str, out: Path) -> None:
    from transformers import AutoModelForCausalLM

    from lightning_grpo import GRPOLoss, GRPOModule
    from lightning_grpo.training.prefix import SharedPrefixPlan

    rank, result = int(os.environ.get("LOCAL_RANK", 0)), {}
    for sharing in ("off", "on"):
        policy = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa").train()
        module = GRPOModule(
            model=policy,
            loss=GRPOLoss(),
            forward=ForwardSettings(prefix_sharing=sharing),
            optimizer=lambda p: torch.optim.SGD(p, lr=0.5),
        )
        batch = rollout_half(rank, policy.config.vocab_size)
        batch.input_ids[:, : batch.prompt_length] = batch.input_ids[0, : batch.prompt_length]  # [B, Lp] one prompt
        module.use_rollout(batch)
        trainer = _trainer(1, [])
        trainer.fit(module, train_dataloaders=DataLoader(GenerationTicks(1, 1), batch_size=None))
        rank = trainer.global_rank
        result[sharing] = _full_state(module.policy)
    result.update(_sharding(module), shared_tokens=SharedPrefixPlan.from_batch(batch).shared_tokens)
    torch.save(result, out / f"prefix-rank{rank}.pt")


def run_e2e(model_dir: str, out: Path, steps: int) -> None:
    from lightning_grpo import (
        GRPOLoss,
        GRPOModule,
        KLSettings,
        PromptDataModule,
        RewardSpec,
        RolloutCallback,
        SamplingConfig,
        VLLMArgs,
    )
    from lightning_grpo.data.tasks import DigitTask

    checks: list[dict] = []

    class Record(Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):  # after RolloutCallback's push + generate
            b = module.rollout_batch
            with torch.no_grad():
                logp = module.token_logprobs(module.policy, b).logp
            mask = b.completion_mask.bool()
            checks.append({"step": trainer.global_step, "gap": (logp - b.rollout_logp)[mask].abs().max().item()})

    L.seed_everything(0, workers=True)
    dm = PromptDataModule(DigitTask(num_train=64, num_val=8), tokenizer_path=model_dir, batch_size=4)
    module = GRPOModule(
        model=model_dir, loss=GRPOLoss(kl=KLSettings(beta=0.04)), optimizer=lambda p: torch.optim.SGD(p, lr=0.1)
    )
    rollout = RolloutCallback(
        engine=VLLMArgs(kv_cache_memory_bytes=32 * 1024**2),
        sampling=SamplingConfig(n=4, temperature=1.0, max_new_tokens=6),
        rewards=[RewardSpec(digit_fraction)],
        seed=7,
    )
    trainer = _trainer(steps, [rollout, Record()])
    trainer.fit(module, datamodule=dm)
    result = {"rank": trainer.global_rank, "step": trainer.global_step, "checks": checks, **_sharding(module)}
    result["reference_units"] = len(fsdp_units(module.reference))
    result["state"] = _full_state(module.policy)
    torch.save(result, out / f"e2e-rank{trainer.global_rank}.pt")


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("modes", help="comma-separated, run in this order in one process: update, prefix, e2e")
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for mode in args.modes.split(","):  # several fits in one pair of ranks: the ranks start (imports, rendezvous) once
        if mode == "update":
            run_update(args.model, out)
        elif mode == "prefix":
            run_prefix(args.model, out)
        elif mode == "e2e":
            run_e2e(args.model, out, args.steps)
        else:
            parser.error(f"unknown mode {mode!r}: update, prefix or e2e")


if __name__ == "__main__":
    main()
