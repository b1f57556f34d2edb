"""A standalone script that trains under Lightning DDP on CPU (gloo); driven by tests/test_distributed.py.

Run it as ``python tests/distributed_worker.py MODE --model DIR --out DIR``. The test starts it
once with no rank variables; Lightning's launcher (``strategy="ddp"``) then re-executes this
script (``sys.argv``) for rank 1 with ``LOCAL_RANK=1``. Each rank writes its results to
``OUT/<mode>-rank<r>.pt``. Modes:

``update``: one optimizer step (SGD) of GRPOModule on a fixed RolloutBatch half per rank (the two
    halves have different token counts and completion widths), for several aggregations and
    ``accumulate_grad_batches`` 1 and 2; plus a control run whose counts are NOT reduced over ranks.
    The test compares the updated weights with a 1-process update on the concatenated batch
    (:func:`single_process_update`, run in the test's own process).
``e2e``: a few steps of the full loop (PromptDataModule, RolloutCallback with the HF engine);
    records which prompts and seeds each rank sampled.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import lightning as L  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from lightning_grpo import GRPOLoss, GRPOModule  # noqa: E402
from lightning_grpo.batch import RolloutBatch  # noqa: E402
from lightning_grpo.data.datamodule import GenerationTicks  # noqa: E402

WORLD = 2
AGGREGATIONS = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
ACCUMULATE = [1, 2]
LR = 0.5
PROMPT_LEN = 3
#: Completion widths of the two halves (each rank pads its rollout to its own longest completion).
WIDTHS = (5, 3)


# --------------------------------------------------------------------------------- the batch
def rollout_half(rank: int, vocab: int) -> RolloutBatch:
    """Rank ``rank``'s half of the generation batch: 4 rows; rank 0 has long completions (width
    5, 17 tokens), rank 1 short ones (width 3, 7 tokens), so per-rank and global normalisers differ."""
    gen = torch.Generator().manual_seed(100 + rank)
    B, Lp, Lc = 4, PROMPT_LEN, WIDTHS[rank]
    ids = torch.randint(5, vocab, (B, Lp + Lc), generator=gen)
    attn = torch.ones(B, Lp + Lc, dtype=torch.long)
    lengths = [5, 5, 4, 3] if rank == 0 else [3, 1, 2, 1]
    mask = torch.zeros(B, Lc)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    attn[rank, 0] = 0  # a left-padded prompt on each rank
    attn[:, Lp:] = mask.long()
    adv = torch.tensor([1.0, -0.5, 0.75, -1.25]) if rank == 0 else torch.tensor([-2.0, 1.5, 0.5, 1.0])
    return RolloutBatch(
        input_ids=ids,
        attention_mask=attn,
        completion_mask=mask,
        advantages=adv,
        rollout_logp=torch.zeros(B, Lc),
        prompt_length=Lp,
        group_size=4,
        temperature=0.7,
    )


def full_batch(vocab: int) -> RolloutBatch:
    """Both halves concatenated (rank 1's completions right-padded to rank 0's width)."""
    halves = [rollout_half(r, vocab) for r in range(WORLD)]
    width = max(WIDTHS)

    def pad(t: torch.Tensor, extra: int) -> torch.Tensor:
        return F.pad(t, (0, extra))

    cat = {}
    for name in ("input_ids", "attention_mask", "completion_mask", "rollout_logp"):
        cat[name] = torch.cat([pad(getattr(h, name), width - h.completion_mask.shape[1]) for h in halves])
    return RolloutBatch(
        **cat,
        advantages=torch.cat([h.advantages for h in halves]),
        prompt_length=PROMPT_LEN,
        group_size=4,
        temperature=0.7,
    )


# --------------------------------------------------------------------------------- one update
def _trainer(devices: int, accumulate: int) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        max_steps=1,
        accumulate_grad_batches=accumulate,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def _module(model_dir: str, aggregation: str) -> GRPOModule:
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(model_dir).train()
    agg_args = {"max_length": 5} if aggregation.endswith("norm") else None
    return GRPOModule(
        model=policy,
        loss=GRPOLoss(aggregation=aggregation, aggregation_args=agg_args),
        optimizer=lambda p: torch.optim.SGD(p, lr=LR),
    )


def _fit(module: GRPOModule, batch: RolloutBatch, devices: int, accumulate: int) -> dict[str, torch.Tensor]:
    module.rollout_batch = batch
    trainer = _trainer(devices, accumulate)
    # an IterableDataset: Lightning adds no DistributedSampler, every rank sees every tick
    trainer.fit(module, train_dataloaders=DataLoader(GenerationTicks(1, accumulate), batch_size=None))
    assert trainer.global_step == 1, trainer.global_step
    return {k: v.detach().clone() for k, v in module.policy.state_dict().items()}


def single_process_update(model_dir: str, aggregation: str) -> dict[str, torch.Tensor]:
    """The reference: one process, the concatenated batch, no accumulation."""
    module = _module(model_dir, aggregation)
    return _fit(module, full_batch(module.policy.config.vocab_size), devices=1, accumulate=1)


def run_update(model_dir: str, out: Path) -> None:
    results = {}
    for aggregation in AGGREGATIONS:
        for accumulate in ACCUMULATE:
            module = _module(model_dir, aggregation)
            rank = int(os.environ.get("LOCAL_RANK", 0))  # Lightning's launcher sets it before the first fit
            half = rollout_half(rank, module.policy.config.vocab_size)
            state = _fit(module, half, devices=WORLD, accumulate=accumulate)
            assert module.trainer.global_rank == rank and module.trainer.world_size == WORLD
            results[(aggregation, accumulate)] = state
    # Control: per-rank counts (no all-reduce), as a module without the global normaliser would do.
    module = _module(model_dir, "token_mean")
    module._global_sum = lambda value: value.to(module.device, torch.float32)
    rank = int(os.environ["LOCAL_RANK"])
    results[("token_mean_local_counts", 1)] = _fit(module, rollout_half(rank, module.policy.config.vocab_size), WORLD, 1)
    info = {
        "rank": rank,
        "backend": torch.distributed.get_backend(),
        "world_size": torch.distributed.get_world_size(),
    }
    torch.save({"states": results, "info": info}, out / f"update-rank{rank}.pt")


# --------------------------------------------------------------------------------- end to end
def run_e2e(model_dir: str, out: Path, steps: int) -> None:
    import lightning_grpo.callbacks.rollout as rollout_mod
    from lightning.pytorch.callbacks import Callback

    from lightning_grpo import RolloutCallback
    from lightning_grpo.data.datamodule import PromptDataModule
    from lightning_grpo.rollout.base import SamplingConfig
    from lightning_grpo.rollout.hf import HFEngine

    calls: list[dict] = []  # what the callback asked the engine for, per generation
    original_generate = HFEngine.generate

    def recording_generate(self, prompt_ids, sampling, seed):
        calls.append({"prompt_ids": [list(p) for p in prompt_ids], "seed": int(seed), "n": sampling.n})
        return original_generate(self, prompt_ids, sampling, seed)

    HFEngine.generate = recording_generate
    prompts: list[dict] = []

    class RecordPrompts(Callback):
        """Wraps the datamodule's prompt schedule to record every call (generation, rank, world)."""

        def setup(self, trainer, pl_module, stage):
            dm = trainer.datamodule
            original = dm.generation_prompts

            def generation_prompts(generation, rank=0, world_size=1, round_=0, max_rounds=1):
                records = original(generation, rank, world_size, round_, max_rounds)
                prompts.append(
                    {"generation": generation, "rank": rank, "world_size": world_size, "round": round_,
                     "prompts": [r["prompt"] for r in records]}  # fmt: skip
                )
                return records

            dm.generation_prompts = generation_prompts

    L.seed_everything(0, workers=True)
    dm = PromptDataModule(tokenizer_path=model_dir, batch_size=4, task_num_train=64, task_num_val=8)
    module = GRPOModule(model=model_dir, optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    rollout = RolloutCallback(engine="hf", sampling=SamplingConfig(n=4, temperature=1.0, max_new_tokens=4), seed=7)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=WORLD,
        strategy="ddp",
        max_steps=steps,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[RecordPrompts(), rollout],
    )
    before = {k: v.detach().clone() for k, v in module_policy_state(model_dir).items()}
    trainer.fit(module, datamodule=dm)
    rank = trainer.global_rank
    expected_seeds = [rollout_mod.derive_seed(7, rank, g * rollout.max_generation_rounds) for g in range(steps)]
    torch.save(
        {
            "rank": rank,
            "world_size": trainer.world_size,
            "global_step": trainer.global_step,
            "generations": rollout.generations,
            "calls": calls,
            "prompts": prompts,
            "expected_seeds": expected_seeds,
            "before": before,
            "after": {k: v.detach().clone() for k, v in module.policy.state_dict().items()},
            "rollout_rows": len(module.rollout_batch),
        },
        out / f"e2e-rank{rank}.pt",
    )


def module_policy_state(model_dir: str) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir).state_dict()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["update", "e2e"])
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.mode == "update":
        run_update(args.model, out)
    else:
        run_e2e(args.model, out, args.steps)


if __name__ == "__main__":
    main(sys.argv[1:])
