"""GPU check: memory, speed and train-inference mismatch of full fine-tuning, LoRA and QLoRA.

Models: Qwen2.5-0.5B and Qwen2.5-1.5B (and 7B, for benchmarks/gpu_recipes.py) built from their
published configurations with random weights (no weights are downloaded; on a CUDA machine
initialised on the GPU and stored in bfloat16), with the built-in character tokenizer (prompt ids stay far
below the 151,936-token vocabulary; the LM head still computes all of it). Engine: transformers
``generate`` on the live policy (``engine: hf``; vLLM need not be installed). Per model and method,
a few GRPO steps of ``P`` prompts x ``G`` samples (prompts of ``prompt_len`` tokens, ``max_new``
new tokens), gradient checkpointing on:

- ``full``: full fine-tuning, float32 weights, trainer ``bf16-mixed``;
- ``lora``: base in bfloat16, LoRA r 16 / alpha 32 on every linear layer (float32), ``32-true``;
- ``qlora``: the same with the base's linear layers in 4 bits (nf4, double quantisation), ``32-true``.

Reported: peak GPU memory (``torch.cuda.max_memory_allocated`` over the run: weights, optimizer
states, activations and ``generate``'s per-step logits), median step time after the first step
(generation included), tokens per second (prompt + completion tokens of the step's batch over the
step time). Then the train-inference mismatch per dtype: a sampler holding the weights in float32
/ bfloat16 / float16 samples with ``generate`` (incremental decoding, KV cache), and a trainer
holding them in float32 recomputes the sampled tokens' log-probs in one teacher-forced forward under
autocast to that dtype (what ``bf16-mixed`` / ``16-mixed`` training does): mean and max
``|logp_train - logp_sample|`` (Qi et al. 2025 compare bf16 and fp16 this way).

    python benchmarks/gpu_check.py --write       # CUDA machine: all rows, the table into docs/evidence/benchmarks.md
    python benchmarks/gpu_check.py --reduced     # the same code on CPU with the tiny model (tests/e2e/test_gpu_check.py)
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from lightning_grpo import PolicySettings

ROOT = Path(__file__).resolve().parents[1]
MARKER = "<!-- gpu-check-results -->"
QWEN25 = dict(
    vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6
)
CONFIGS = {
    "qwen2.5-0.5b": dict(
        QWEN25,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
    ),
    "qwen2.5-1.5b": dict(
        QWEN25,
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
    ),
    "qwen2.5-7b": dict(
        QWEN25,
        vocab_size=152064,
        tie_word_embeddings=False,
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
    ),
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
    ),  # the --reduced CPU run; vocabulary = the tokenizer's
}
METHODS = ("full", "lora", "qlora")
MISMATCH_DTYPES = ("float32", "bfloat16", "float16")


def build_model(name: str, cache: Path) -> Path:
    """A random-weight model of configuration ``name`` with the character tokenizer, saved once under ``cache``."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from lightning_grpo.models.tiny import tiny_model_dir

    target = cache / f"random-{name}"
    if (target / "config.json").exists():
        return target
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir()))
    fields = {"vocab_size": len(tokenizer), **CONFIGS[name]}
    config = Qwen2Config(**fields, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    if torch.cuda.is_available():  # initialised on the GPU (a 7B model in seconds), stored in bfloat16
        with torch.device("cuda"):
            model = Qwen2ForCausalLM(config)
        model.to(torch.bfloat16).save_pretrained(target)
        del model
        torch.cuda.empty_cache()
    else:
        Qwen2ForCausalLM(config).save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def method_settings(method: str) -> tuple[PolicySettings, str]:
    """(GRPOModule policy settings, with gradient checkpointing; trainer precision) of a method."""
    from lightning_grpo import LoraSettings, PolicySettings, QuantizationSettings

    lora = LoraSettings(r=16, alpha=32, target_modules="all-linear")
    if method == "full":
        return PolicySettings(dtype="float32", gradient_checkpointing=True), "bf16-mixed"
    if method == "lora":
        return PolicySettings(dtype="bfloat16", lora=lora, gradient_checkpointing=True), "32-true"
    quantization = QuantizationSettings("nf4", True)
    return PolicySettings(
        dtype="bfloat16", lora=lora, quantization=quantization, gradient_checkpointing=True
    ), "32-true"


def prompts(count: int, length: int) -> list[dict]:
    """``count`` digit prompts of ``length`` characters (= tokens) each, answers for prefix_match."""
    gen = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(count):
        digits = "".join(str(int(d)) for d in torch.randint(0, 10, (length - 1,), generator=gen))
        rows.append({"prompt": digits + "=", "answer": str((int(digits[-1]) + 1) % 10)})
    return rows


def train_row(model_dir: Path, method: str, steps: int, P: int, G: int, prompt_len: int, max_new: int) -> dict:
    """Run ``steps`` GRPO steps; peak memory, median step time, tokens per second."""
    import lightning as L

    from lightning_grpo import GRPOModule, PromptDataModule, RewardSpec, RolloutCallback, SamplingConfig
    from lightning_grpo.data.sources import Rows

    policy, precision = method_settings(method)
    cuda = torch.cuda.is_available()
    starts, tokens = [], []

    class Clock(L.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            starts.append(time.perf_counter())

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            tokens.append(int(module.rollout_batch.attention_mask.sum()))

        def on_train_end(self, trainer, module):
            starts.append(time.perf_counter())

    L.seed_everything(0)
    module = GRPOModule(model=str(model_dir), policy=policy, optimizer=lambda p: torch.optim.AdamW(p, lr=1e-5))
    rollout = RolloutCallback(
        engine="hf", sampling=SamplingConfig(n=G, max_new_tokens=max_new), rewards=[RewardSpec("prefix_match")]
    )
    data = PromptDataModule(source=Rows(prompts(4 * P, prompt_len)), tokenizer_path=str(model_dir), batch_size=P)
    trainer = L.Trainer(
        max_steps=steps,
        accelerator="gpu" if cuda else "cpu",
        devices=1,
        precision=precision,
        callbacks=[rollout, Clock()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.fit(module, datamodule=data)
    times = [b - a for a, b in zip(starts, starts[1:])][1:] or [starts[1] - starts[0]]  # the first step warms up
    step = statistics.median(times)
    return {
        "method": method,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "step_s": step,
        "tokens_per_s": statistics.median(tokens) / step,
        "trainable": sum(p.numel() for p in module.policy.parameters() if p.requires_grad),
    }


@torch.no_grad()
def mismatch_row(
    model_dir: Path, dtype: str, P: int, G: int, prompt_len: int, max_new: int, temperature: float = 1.0
) -> dict:
    """The sampler holds the weights in ``dtype`` and decodes with a KV cache (as an inference engine);
    the trainer recomputes the sampled tokens' log-probs teacher-forced from float32 weights under
    autocast to ``dtype`` (``bf16-mixed`` / ``16-mixed``; float32: no autocast)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lightning_grpo.rollout.base import SamplingConfig, rollout_to_tensors
    from lightning_grpo.rollout.hf import HFEngine

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    sampler = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, dtype)).to(device)
    ids = [tokenizer(r["prompt"])["input_ids"] for r in prompts(P, prompt_len)]
    engine = HFEngine(sampler, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    rollout = engine.generate(ids, SamplingConfig(n=G, temperature=temperature, max_new_tokens=max_new), seed=0)
    del engine, sampler
    trainer = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(device)
    t = rollout_to_tensors(rollout, tokenizer.pad_token_id)
    Lc = t.completion_mask.shape[1]
    position_ids = (t.attention_mask.cumsum(-1) - 1).clamp(min=0)  # [B, Lp+Lc]
    autocast = torch.autocast(device, dtype=getattr(torch, dtype), enabled=dtype != "float32")
    with autocast:
        logits = trainer(
            input_ids=t.input_ids.to(device),
            attention_mask=t.attention_mask.to(device),
            position_ids=position_ids.to(device),
        ).logits[:, -Lc - 1 : -1]  # [B, Lc, V]
    logp = torch.log_softmax(logits.float() / temperature, -1).gather(-1, t.input_ids[:, -Lc:, None].to(device))
    gap = (logp.squeeze(-1).cpu() - t.rollout_logprobs).abs()[t.completion_mask.bool()]  # [tokens]
    return {"dtype": dtype, "mean_abs": gap.mean().item(), "max_abs": gap.max().item(), "tokens": gap.numel()}


def run(
    models: list[str], methods: list[str], steps: int, P: int, G: int, prompt_len: int, max_new: int, cache: Path
) -> dict:
    """Every (model, method) training row and every (model, dtype) mismatch row."""
    train, mismatch = [], []
    for name in models:
        model_dir = build_model(name, cache)
        for method in methods:
            train.append({"model": name, **train_row(model_dir, method, steps, P, G, prompt_len, max_new)})
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        for dtype in MISMATCH_DTYPES:
            mismatch.append({"model": name, **mismatch_row(model_dir, dtype, P, G, prompt_len, max_new)})
    return {
        "machine": machine(),
        "train": train,
        "mismatch": mismatch,
        "shape": f"{P} prompts x {G} samples, {prompt_len}-token prompts, {max_new} new tokens, {steps} steps",
    }


def machine() -> str:
    device = (
        torch.cuda.get_device_name()
        if torch.cuda.is_available()
        else f"CPU ({platform.processor() or platform.machine()})"
    )
    import transformers

    return f"{device}; torch {torch.__version__}, transformers {transformers.__version__}, Python {platform.python_version()}"


def table(result: dict) -> str:
    lines = [
        f"Machine: {result['machine']}. Shape: {result['shape']}.",
        "",
        "| model | method | trainable parameters | peak GPU memory (GiB) | step (s) | tokens / s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in result["train"]:
        peak = "n/a" if r["peak_gib"] is None else f"{r['peak_gib']:.2f}"
        lines.append(
            f"| {r['model']} | {r['method']} | {r['trainable']:,} | {peak} | {r['step_s']:.2f} | {r['tokens_per_s']:.0f} |"
        )
    lines += ["", "| model | dtype | mean \\|Δlogp\\| | max \\|Δlogp\\| | tokens |", "|---|---|---:|---:|---:|"]
    for r in result["mismatch"]:
        lines.append(f"| {r['model']} | {r['dtype']} | {r['mean_abs']:.2e} | {r['max_abs']:.2e} | {r['tokens']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reduced", action="store_true", help="CPU mechanics: the tiny model, 2 steps, small batches")
    parser.add_argument(
        "--models", nargs="+", default=["qwen2.5-0.5b", "qwen2.5-1.5b"], choices=sorted(set(CONFIGS) - {"tiny"})
    )
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--cache", type=Path, default=ROOT / "runs" / "gpu-check-models")
    parser.add_argument(
        "--write", action="store_true", help="put the table into docs/evidence/benchmarks.md (CUDA only)"
    )
    args = parser.parse_args(argv)
    if args.write and (args.reduced or not torch.cuda.is_available()):
        raise SystemExit("--write records GPU figures: run it on a CUDA machine without --reduced")
    shape = dict(P=2, G=2, prompt_len=16, max_new=4) if args.reduced else dict(P=8, G=8, prompt_len=128, max_new=64)
    models = ["tiny"] if args.reduced else args.models
    result = run(models, args.methods, 2 if args.reduced else args.steps, cache=args.cache, **shape)
    text = table(result)
    print(text)
    if args.write:
        page = (ROOT / "docs" / "evidence" / "benchmarks.md").read_text()
        head, _, rest = page.partition(MARKER)
        _, _, tail = rest.partition(MARKER)
        (ROOT / "docs" / "evidence" / "benchmarks.md").write_text(f"{head}{MARKER}\n{text}\n{MARKER}{tail}")
    return result


if __name__ == "__main__":
    main()
