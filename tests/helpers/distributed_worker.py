"""A standalone script that trains under Lightning DDP on CPU (gloo); driven by tests/e2e/test_distributed.py.

Run it as ``python tests/helpers/distributed_worker.py MODE --model DIR --out DIR``. The test starts it
once with no rank variables; Lightning's launcher (``strategy="ddp"``) then re-executes this
script (``sys.argv``) for rank 1 with ``LOCAL_RANK=1``. Each rank writes its results to
``OUT/<mode>-rank<r>.pt``. Modes:

``update``: one optimizer step (SGD) of GRPOModule on a fixed RolloutBatch half per rank (the two
    halves have different token counts and completion widths), for several aggregations and
    ``accumulate_grad_batches`` 1 and 2; plus a control run whose counts are NOT reduced over ranks,
    a skip asked by one rank, and an EntropyController whose ranks would decide differently.
    The test compares the updated weights with a 1-process update on the concatenated batch
    (:func:`single_process_update`, run in the test's own process).
``e2e``: a few steps of the full loop (PromptDataModule, RolloutCallback with ``--engine hf`` or
    ``vllm``); records which prompts and seeds each rank sampled and, after every generation, the
    gap between the engine's log-probs and the policy's (shows the weight push worked on each rank).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# in-process vLLM without its compile step (docs/platform notes); harmless for the other modes
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from lightning_grpo import GRPOLoss, GRPOModule
from lightning_grpo.core.batch import RolloutBatch
from lightning_grpo.data.datamodule import GenerationTicks

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
def _trainer(devices: int, accumulate: int, callbacks: list | None = None) -> L.Trainer:
    return L.Trainer(
        callbacks=callbacks,
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


def _fit(
    module: GRPOModule, batch: RolloutBatch, devices: int, accumulate: int, metrics: dict | None = None, callbacks=None
) -> dict[str, torch.Tensor]:
    module.use_rollout(batch)
    trainer = _trainer(devices, accumulate, callbacks)
    # an IterableDataset: Lightning adds no DistributedSampler, every rank sees every tick
    trainer.fit(module, train_dataloaders=DataLoader(GenerationTicks(1, accumulate), batch_size=None))
    assert trainer.global_step == 1, trainer.global_step
    if metrics is not None:  # the logged step metrics (train/*)
        metrics.update({k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("train/")})
    return {k: v.detach().clone() for k, v in module.policy.state_dict().items()}


def single_process_update(model_dir: str, aggregation: str, metrics: dict | None = None) -> dict[str, torch.Tensor]:
    """The reference: one process, the concatenated batch, no accumulation."""
    module = _module(model_dir, aggregation)
    return _fit(module, full_batch(module.policy.config.vocab_size), devices=1, accumulate=1, metrics=metrics)


def run_update(model_dir: str, out: Path) -> None:
    results, metrics = {}, {}
    for aggregation in AGGREGATIONS:
        for accumulate in ACCUMULATE:
            module = _module(model_dir, aggregation)
            rank = int(
                os.environ.get("LOCAL_RANK", 0)
            )  # rank 1 starts with LOCAL_RANK=1; rank 0 has none before its first fit
            half = rollout_half(rank, module.policy.config.vocab_size)
            metrics[(aggregation, accumulate)] = {}
            state = _fit(module, half, devices=WORLD, accumulate=accumulate, metrics=metrics[(aggregation, accumulate)])
            assert module.trainer.global_rank == rank and module.trainer.world_size == WORLD
            if (aggregation, accumulate) == (
                "token_mean",
                1,
            ):  # a DDP checkpoint (rank 0 writes it): the test exports it
                module.trainer.save_checkpoint(out / "ddp.ckpt")
            results[(aggregation, accumulate)] = state
    # A guard on rank 1 alone asks to skip the step: every rank must skip it (weights stay in sync).
    module = _module(model_dir, "token_mean")
    if rank == 1:
        module.on_train_batch_start = lambda batch, batch_idx: module.skip_optimizer_step("test: rank 1 only")
    results[("skip_on_rank_1", 1)] = _fit(module, rollout_half(rank, module.policy.config.vocab_size), WORLD, 1)
    metrics[("skip_on_rank_1", 1)] = {"skipped_steps": module.skipped_steps}
    # EntropyController: rank 0's decision (its floor is above the entropy: raise the bonus) is every
    # rank's, although rank 1 alone would keep the knob (its floor is 0).
    from lightning_grpo import EntropyController

    module = _module(model_dir, "token_mean")
    controller = EntropyController(floor=100.0 if rank == 0 else 0.0, window=1)
    _fit(module, rollout_half(rank, module.policy.config.vocab_size), WORLD, 1, callbacks=[controller])
    metrics[("entropy_control", 1)] = {"entropy_coef": module.loss_fn.terms.entropy_coef, "moves": controller.moves}
    # Control: per-rank counts (no all-reduce), as a module without the global normaliser would do.
    module = _module(model_dir, "token_mean")
    module._global_sum = lambda value: value.to(module.device, torch.float32)
    rank = int(os.environ["LOCAL_RANK"])
    results[("token_mean_local_counts", 1)] = _fit(
        module, rollout_half(rank, module.policy.config.vocab_size), WORLD, 1
    )
    info = {
        "rank": rank,
        "backend": torch.distributed.get_backend(),
        "world_size": torch.distributed.get_world_size(),
    }
    torch.save({"states": results, "metrics": metrics, "info": info}, out / f"update-rank{rank}.pt")


# --------------------------------------------------------------------------------- end to end
def run_e2e(model_dir: str, out: Path, steps: int, engine: str, policy: str = "path", url: str | None = None) -> None:
    """``steps`` training steps of the full loop with ``engine`` ("hf" or "vllm") on each rank; the
    policy is given to GRPOModule as a model directory (``policy="path"``) or as a built
    ``nn.Module`` (``"module"``: the vLLM engine is then built from a per-rank save of it)."""
    from lightning.pytorch.callbacks import Callback

    from lightning_grpo import RolloutCallback, ServerSettings, VLLMArgs
    from lightning_grpo.data.datamodule import PromptDataModule
    from lightning_grpo.data.reward_set import RewardSpec
    from lightning_grpo.data.tasks import DigitTask
    from lightning_grpo.rollout.base import SamplingConfig

    pushes: list[bool] = []  # per weight push: did this rank send the weights (or wait for them)?
    if engine == "hf":
        from lightning_grpo.rollout.hf import HFEngine as engine_class
    elif engine == "vllm_server":  # every rank samples on the same server; rank 0 alone pushes
        from lightning_grpo.rollout.server_engine import ServerEngine as engine_class

        original_send = engine_class.send_push

        def recording_send(self, buckets, version):
            pushes.append(buckets is not None)
            return original_send(self, buckets, version)

        engine_class.send_push = recording_send
    else:
        from lightning_grpo.rollout.vllm import VLLMEngine as engine_class

    calls: list[dict] = []  # what the callback asked the engine for, per generation
    original_generate = engine_class.generate

    def recording_generate(self, prompt_ids, sampling, seed):
        calls.append({"prompt_ids": [list(p) for p in prompt_ids], "seed": int(seed), "n": sampling.n})
        return original_generate(self, prompt_ids, sampling, seed)

    engine_class.generate = recording_generate
    prompts: list[dict] = []
    checks: list[dict] = []

    class Record(Callback):
        """Records the datamodule's prompt schedule calls (generation, rank, world) and, after each
        generation, how far the engine's log-probs are from the policy's (weights in sync?)."""

        def setup(self, trainer, pl_module, stage):
            dm = trainer.datamodule
            original = dm.generation_prompts

            def generation_prompts(generation, rank=0, world_size=1, round_=0, max_rounds=1):
                records = original(generation, rank, world_size, round_, max_rounds)
                prompts.append(
                    {
                        "generation": generation,
                        "rank": rank,
                        "world_size": world_size,
                        "round": round_,
                        "prompts": [r["prompt"] for r in records],
                    }
                )
                return records

            dm.generation_prompts = generation_prompts

        def on_train_batch_start(self, trainer, module, batch, batch_idx):  # runs after RolloutCallback's
            b = module.rollout_batch
            with torch.no_grad():
                logp = module.token_logprobs(module.policy, b).logp
            mask = b.completion_mask.bool()
            world = torch.tensor([1.0])
            torch.distributed.all_reduce(world)  # the default group still spans every rank
            checks.append({"logprob_gap": (logp - b.rollout_logp)[mask].abs().max().item(), "ranks": world.item()})

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            checks[-1]["local_reward_mean"] = module.rollout_metrics["reward_mean"]
            checks[-1]["logged_reward_mean"] = float(trainer.callback_metrics["train/reward_mean"])
            checks[-1]["local_length_max"] = module.rollout_metrics["completion_length_max"]
            checks[-1]["logged_length_max"] = float(trainer.callback_metrics["train/completion_length_max"])

    L.seed_everything(0, workers=True)
    dm = PromptDataModule(DigitTask(num_train=64, num_val=8), tokenizer_path=model_dir, batch_size=4)
    model = model_dir if policy == "path" else module_from(model_dir)
    module = GRPOModule(model=model, optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    settings = {
        "vllm": lambda: VLLMArgs(kv_cache_memory_bytes=32 * 1024**2),
        "vllm_server": lambda: ServerSettings(urls=[url] if url else None),
    }
    rollout = RolloutCallback(
        engine=settings[engine]() if engine in settings else engine,
        sampling=SamplingConfig(n=4, temperature=1.0, max_new_tokens=4),
        rewards=[RewardSpec(digit_fraction)],  # varies between samples: nonzero advantages
        seed=7,
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=WORLD,
        strategy="ddp",
        max_steps=steps,
        log_every_n_steps=1,  # Record reads every step's logged metrics
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[rollout, Record()],  # Record after RolloutCallback: it reads the new rollout batch
    )
    before = {k: v.detach().clone() for k, v in module_policy_state(model_dir).items()}
    trainer.fit(module, datamodule=dm)
    rank = trainer.global_rank
    torch.save(
        {
            "rank": rank,
            "world_size": trainer.world_size,
            "global_step": trainer.global_step,
            "generations": rollout.generations,
            "calls": calls,
            "prompts": prompts,
            "checks": checks,
            "before": before,
            "after": {k: v.detach().clone() for k, v in module.policy.state_dict().items()},
            "rollout_rows": len(module.rollout_batch),
            "process_group_after_fit": torch.distributed.is_initialized(),
            "pushes": pushes,
        },
        out / f"e2e-{engine}-rank{rank}.pt",
    )


def digit_fraction(completions: list[str], **_columns) -> list[float]:
    """Share of digits in the completion: a dense reward an untrained policy already varies on."""
    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]


def module_from(model_dir: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir)


def module_policy_state(model_dir: str) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir).state_dict()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("modes", help="comma-separated, run in this order in one process: update, e2e")
    parser.add_argument("--engine", choices=["hf", "vllm", "vllm_server"], default="hf")
    parser.add_argument("--url", default=None, help="vLLM server for --engine vllm_server")
    parser.add_argument("--policy", choices=["path", "module"], default="path")
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for mode in args.modes.split(","):  # several fits in one pair of ranks: the ranks start once
        if mode == "update":
            run_update(args.model, out)
        elif mode == "e2e":
            run_e2e(args.model, out, args.steps, args.engine, args.policy, args.url)
        else:
            parser.error(f"unknown mode {mode!r}: update or e2e")


if __name__ == "__main__":
    main(sys.argv[1:])
