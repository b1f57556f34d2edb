"""The training side of each GPU recipe, measured on a CUDA machine: peak memory and step time.

For each ``recipes/qwen2.5-*.yaml`` the recipe runs through ``lightning-grpo fit`` as written
(trainer precision, model dtype, LoRA / QLoRA, gradient checkpointing, loss, batch size,
accumulation, guards) with these changes only, since the GPU machine has neither vLLM nor the weights:

- the model is a random-init model of the recipe's architecture (benchmarks/gpu_check.py's
  configurations) with the built-in character tokenizer;
- the engine is ``hf`` (transformers ``generate`` on the live policy) instead of vLLM;
- the data are digit prompts of ``max_prompt_length`` tokens (reward ``prefix_match``), no chat
  template, no validation; a random model seldom samples its end token, so every completion runs to
  ``max_new_tokens``: the longest rows the recipe can produce. The agent recipe runs as a plain
  rollout whose completions are ``max_episode_tokens`` long (every turn and tool reply of an episode);
- 2 optimizer steps, no checkpoint, no logger.

Measured in the run (``Probe``): the peak of GPU memory allocated while the trainer works (from the
end of each generation to the end of the step: reward, reference / old log-probs, forward, backward,
optimizer), the memory the trainer holds while the engine generates (weights, adapter, optimizer
states), the reserved peak (PyTorch's caching allocator), and the optimizer step's time without
generation. The engine side is computed, not measured: vLLM takes ``gpu_memory_utilization`` of the
card for its weights, activations and KV cache while it generates (and with ``sleep_level`` gives
its memory back while the trainer trains). Budget on the recipe's card = trainer's resident memory
+ vLLM's share + CUDA context, and the training peak + CUDA context (+ vLLM's share unless it sleeps).

    python benchmarks/gpu_recipes.py --write                     # CUDA: every GPU recipe, into docs/evidence/benchmarks.md
    python benchmarks/gpu_recipes.py --recipes recipes/qwen2.5-0.5b_gsm8k.yaml
    python benchmarks/gpu_recipes.py --smoke      # CPU: the same code on the tiny model, short rows (tests/e2e/test_gpu_recipes.py)
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_step import write_section
from gpu_check import ROOT, build_model, machine

SECTION = "## GPU recipes: the training side, measured"
ARCH = {"0.5B": "qwen2.5-0.5b", "1.5B": "qwen2.5-1.5b", "7B": "qwen2.5-7b"}
#: what the cards in the recipes' names hold, GiB (nvidia-smi's total: 24 GB = RTX 4090 / 3090, L4, A10G)
CARD_GIB = {"24gb": 23.99, "32gb": 31.75}  # 32 GB: V100 32 GB (31.75), RTX 5090 (31.84)
CUDA_CONTEXT_GIB = 0.5  # the CUDA context and cuBLAS workspaces outside PyTorch's allocator (one process)
#: --smoke: the tiny model on CPU, short rows, full precision, no quantisation (the mechanics only)
SMOKE = {
    "trainer": {"accelerator": "cpu", "precision": "32-true", "accumulate_grad_batches": 2},
    "data": {"batch_size": 2, "format": {"max_prompt_length": 16}},
    "max_new_tokens": 4,
}
CUDA = torch.cuda.is_available()


def synchronize() -> None:
    if CUDA:
        torch.cuda.synchronize()


def memory(kind: str) -> int:
    """torch.cuda's ``memory_allocated`` / ``max_memory_allocated`` / ``max_memory_reserved``; 0 on CPU."""
    return getattr(torch.cuda, kind)() if CUDA else 0


class Probe(L.Callback):
    """Peak memory of the trainer's side and step times; written as JSON to ``out`` at the end."""

    def __init__(self, out: str) -> None:
        self.out, self.rows, self.generate_s = out, [], 0.0
        self.resident, self.generate_peak, self.start = [], [], None
        from lightning_grpo.rollout.hf import HFEngine

        original = HFEngine.generate

        def generate(engine, *args, **kwargs):  # the engine's peak, then a fresh peak for the trainer's side
            synchronize()
            self.resident.append(memory("memory_allocated"))
            begin = time.perf_counter()
            result = original(engine, *args, **kwargs)
            synchronize()
            self.generate_s += time.perf_counter() - begin
            self.generate_peak.append(memory("max_memory_allocated"))
            if CUDA:  # generate's cached blocks go back: vLLM, not this process, holds the KV cache in a real run
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            return result

        HFEngine.generate = generate

    def on_train_start(self, trainer, module):
        synchronize()
        self.start, self.step = time.perf_counter(), trainer.global_step

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:  # within an optimizer step's micro-batches
            return
        synchronize()
        now = time.perf_counter()
        self.rows.append(
            {
                "step_s": now - self.start,
                "generate_s": self.generate_s,
                "train_peak": memory("max_memory_allocated"),
                "reserved_peak": memory("max_memory_reserved"),
            }
        )
        self.start, self.generate_s, self.step = now, 0.0, trainer.global_step

    def on_train_end(self, trainer, module):
        trainable = sum(p.numel() for p in module.policy.parameters() if p.requires_grad)
        Path(self.out).write_text(
            json.dumps(
                {
                    "steps": self.rows,
                    "resident": self.resident,
                    "generate_peak": self.generate_peak,
                    "trainable": trainable,
                }
            )
        )


def derived_config(recipe: dict, model_dir: Path, data_file: Path, steps: int, out: Path, smoke: bool = False) -> dict:
    """The recipe with the changes the module docstring lists (and ``SMOKE``'s)."""
    cfg = copy.deepcopy(recipe)
    trainer = cfg["trainer"]
    if smoke:
        trainer.update(SMOKE["trainer"])
        cfg["data"].update(SMOKE["data"])
        policy = cfg["model"].setdefault("policy", {})
        policy.pop("quantization", None)
        policy["dtype"] = "float32"
    # the recipe's own callbacks go (ModelCheckpoint); the module attaches the default guards
    trainer.update(
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        limit_val_batches=0,
        val_check_interval=None,
        enable_model_summary=False,
        callbacks=[{"class_path": "gpu_recipes.Probe", "init_args": {"out": str(out)}}],
    )
    rollout = cfg["rollout"].get("init_args", cfg["rollout"])  # an agent recipe names its callback class
    sampling = dict(rollout["sampling"])
    sampling["max_new_tokens"] = (
        SMOKE["max_new_tokens"] if smoke else rollout.get("max_episode_tokens", sampling["max_new_tokens"])
    )
    cfg["rollout"] = {"engine": "hf", "sampling": sampling, "rewards": [{"name": "prefix_match"}]}
    cfg["model"].setdefault("forward", {}).setdefault("rows_per_pass", 8)
    cfg["model"]["model"] = str(model_dir)
    data = cfg["data"]
    data.pop("val_files", None)
    limit = data.get("format", {}).get("max_prompt_length")  # the recipe's prompt length; plain-text digit prompts
    data.update(train_files=str(data_file), tokenizer_path=str(model_dir), format={"max_prompt_length": limit})
    return cfg


def child(recipe_path: Path, steps: int, cache: Path, smoke: bool = False) -> dict:
    """Run one recipe's training side in a ``lightning-grpo fit`` subprocess; its Probe's figures."""
    recipe = yaml.safe_load(recipe_path.read_text())
    arch = "tiny" if smoke else next(v for k, v in ARCH.items() if k in recipe["model"]["model"])
    model_dir = build_model(arch, cache)
    work = Path(tempfile.mkdtemp(prefix="gpu-recipe-"))
    cfg = derived_config(recipe, model_dir, work / "data.jsonl", steps, work / "probe.json", smoke)
    length, batch = (
        cfg["data"]["format"]["max_prompt_length"] - 1,
        cfg["data"]["batch_size"],
    )  # - 1: room for a BOS token
    accumulate = cfg["trainer"].get("accumulate_grad_batches", 1)
    with open(work / "data.jsonl", "w") as f:
        for i in range(batch * accumulate * (steps + 1)):
            digits = "".join(str((7919 * i + 31 * j) % 10) for j in range(length - 1))
            f.write(json.dumps({"prompt": digits + "=", "answer": str((int(digits[-1]) + 1) % 10)}) + "\n")
    out = work / "probe.json"
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-m", "lightning_grpo", "fit", "-c", str(work / "config.yaml")],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{recipe_path.name}: exit {done.returncode}\n{done.stderr[-4000:]}")
    return {"recipe": recipe_path.name, "arch": arch, **measured(json.loads(out.read_text()))}


def measured(probe: dict) -> dict:
    """The trainer side in GiB, and the last optimizer step's time without generation."""
    gib, last = 2**30, probe["steps"][-1]
    return {
        "trainable": probe["trainable"],
        "resident_gib": max(probe["resident"]) / gib,
        "train_peak_gib": max(s["train_peak"] for s in probe["steps"]) / gib,
        "reserved_peak_gib": max(s["reserved_peak"] for s in probe["steps"]) / gib,
        "train_s": last["step_s"] - last["generate_s"],
    }


def budget(row: dict, recipe_dir: Path = ROOT / "recipes") -> dict:
    """``row`` with vLLM's share as its recipe file sets it now, and the totals on the card its name gives."""
    name = row["recipe"]
    recipe = yaml.safe_load((recipe_dir / name).read_text())
    engine = recipe["rollout"].get("init_args", recipe["rollout"]).get("engine", "vllm")
    vllm = engine.get("init_args", {}) if isinstance(engine, dict) else {}
    util, sleeps = vllm.get("gpu_memory_utilization", 0.5), bool(vllm.get("sleep_level"))
    card = next((v for k, v in CARD_GIB.items() if k in name), None)
    # vLLM takes util x the card: the trainer's side must fit in the rest, at both phases
    trainer_side = max(row["resident_gib"], 0.0 if sleeps else row["reserved_peak_gib"]) + CUDA_CONTEXT_GIB
    smallest = trainer_side / (1 - util)
    if sleeps:  # vLLM gives its memory back while the trainer trains
        smallest = max(smallest, row["reserved_peak_gib"] + CUDA_CONTEXT_GIB)
    out = {**row, "util": util, "sleeps": sleeps, "card_gib": card, "smallest_card_gib": smallest}
    if card:
        vllm = util * card
        out["generate_total"] = row["resident_gib"] + vllm + CUDA_CONTEXT_GIB
        out["train_total"] = row["reserved_peak_gib"] + CUDA_CONTEXT_GIB + (0.0 if sleeps else vllm)
    return out


def table(rows: list[dict], command: str, measured_on: str | None = None) -> str:
    lines = [
        SECTION,
        "",
        f"Machine: {measured_on or machine()}. Command: `{command}`. Each recipe as written, with a random-init model of its "
        "architecture, engine `hf` instead of vLLM, every completion at its longest, 2 optimizer steps "
        "(benchmarks/gpu_recipes.py's docstring). Trainer side measured; vLLM's share computed as "
        f"`gpu_memory_utilization` x the card ({CARD_GIB['24gb']} GiB for a 24 GB card), CUDA context "
        f"{CUDA_CONTEXT_GIB} GiB. 'while generating' = trainer's resident memory + vLLM's share + context; "
        "'while training' = reserved peak + context (+ vLLM's share unless it sleeps). Smallest card: "
        "the trainer's side (resident, and the reserved peak unless vLLM sleeps, + context) over 1 - the share.",
        "",
        "| recipe | trainable parameters | trainer resident (GiB) | training peak allocated / reserved (GiB) | "
        "optimizer step without generation (s) | vLLM's share | smallest card that holds it (GiB) | "
        "on the recipe's card: while generating / while training (GiB) |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in map(budget, rows):
        on_card = (
            f"{r['generate_total']:.1f} / {r['train_total']:.1f} of {r['card_gib']} "
            f"({max(r['generate_total'], r['train_total']) / r['card_gib']:.0%})"
            if r.get("card_gib")
            else "no card named"
        )
        lines.append(
            f"| {r['recipe']} | {r['trainable']:,} | {r['resident_gib']:.2f} | {r['train_peak_gib']:.2f} / "
            f"{r['reserved_peak_gib']:.2f} | {r['train_s']:.1f} | {r['util']:.0%}{' (sleeps)' if r['sleeps'] else ''} | "
            f"{r['smallest_card_gib']:.1f} | {on_card} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipes", nargs="+", type=Path, default=sorted((ROOT / "recipes").glob("qwen2.5-*.yaml")))
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=ROOT / "runs" / "gpu-check-models")
    parser.add_argument("--json", type=Path, help="also write the measured rows as JSON here")
    parser.add_argument("--render", type=Path, help="no run: the table from rows --json wrote (on any machine)")
    parser.add_argument("--machine", help="with --render: the machine the rows were measured on")
    parser.add_argument("--write", action="store_true", help="put the table into docs/evidence/benchmarks.md")
    parser.add_argument(
        "--smoke", action="store_true", help="CPU mechanics: the tiny model, short rows, no figures kept"
    )
    args = parser.parse_args(argv)
    if args.render:
        text = table(
            json.loads(args.render.read_text()),
            f"python benchmarks/gpu_recipes.py --json {args.render.name}",
            args.machine,
        )
        print(text)
        if args.write:
            write_section(text, SECTION)
        return
    if not CUDA and not args.smoke:
        raise SystemExit("benchmarks/gpu_recipes.py measures GPU memory: run it on a CUDA machine (or --smoke on CPU)")
    if args.write and args.smoke:
        raise SystemExit("--write records GPU figures: run it without --smoke")
    rows = []
    for path in args.recipes:
        try:
            rows.append(child(path, args.steps, args.cache, args.smoke))
        except RuntimeError as error:
            print(error, file=sys.stderr, flush=True)
            continue
        print(json.dumps(rows[-1]), flush=True)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
    text = table(rows, "python benchmarks/gpu_recipes.py --json rows.json --write")
    print(text)
    if args.write:
        write_section(text, SECTION)


if __name__ == "__main__":
    main()
