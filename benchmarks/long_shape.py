"""The long-prompt shape of the whole-step comparison: the ~10M-parameter Qwen2 of
bench_step.py ("10m") with the printable-ASCII tokenizer (one token per character), prompts of
``P`` random characters (exactly ``P`` tokens, no chat template), ragged completions.

A random model ends a completion when it happens to sample EOS; with about 100 tokens that gives
a mean near 135 of 256 new tokens. :func:`long_model_dir` raises the EOS logit by about
``EOS_BOOST`` nats (the EOS row of the LM head moved along the mean direction of the final hidden
states) so that completions average about 64 of 256 tokens, as the issue's shape asks. Ours and
TRL load the same folder and sample the same prompts, so both see the same length distribution.
"""

from __future__ import annotations

import random
import string
from pathlib import Path

EOS_BOOST = 0.9  # nats: mean completion about 64 of 256 tokens at P = 512 (0.75: 78-91 in a trial run, 1.0: 47)
ALPHABET = string.ascii_letters + string.digits + " "


def long_model_dir(max_len: int) -> Path:
    """The "10m" text model (positions >= ``max_len``) with the EOS boost, cached beside the tiny models."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bench_step import SIZES
    from lightning_grpo.models.tiny import TinyModelConfig, tiny_model_dir

    positions = max(1024, 1 << (max_len - 1).bit_length())
    base = tiny_model_dir(TinyModelConfig(**SIZES["10m"], tokenizer="text", max_position_embeddings=positions))
    out = base.with_name(f"{base.name}-eos{EOS_BOOST}")
    if (out / "config.json").is_file():
        return out
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(base)
    probe = tokenizer(random_text(random.Random(1234), 512), return_tensors="pt")["input_ids"]  # [1, 512]
    with torch.no_grad():
        hidden = model(probe, output_hidden_states=True).hidden_states[-1][0]  # [512, H], after the final norm
        mean = hidden.mean(0)  # [H]; cosine of each state to it: about 0.76-0.96
        model.lm_head.weight[tokenizer.eos_token_id] += EOS_BOOST * mean / mean.norm() ** 2
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(out)
    return out


def model_dir(config: dict, prompt_tokens: int, max_new_tokens: int) -> Path:
    """The model of a benchmark row: the long-prompt model when ``prompt_tokens`` (whatever ``config``
    says: the "10m" text model), else the tiny model of ``config`` (digit task)."""
    from lightning_grpo.models.tiny import TinyModelConfig, tiny_model_dir

    if prompt_tokens:
        return long_model_dir(prompt_tokens + max_new_tokens)
    return tiny_model_dir(TinyModelConfig(**config))


def kv_cache_bytes(path: str | Path, sequences: int, max_len: int) -> int:
    """float32 keys and values for ``sequences`` of ``max_len`` tokens of the model at ``path``."""
    import json

    c = json.loads((Path(path) / "config.json").read_text())
    per_token = (
        2 * c["num_hidden_layers"] * c["num_key_value_heads"] * (c["hidden_size"] // c["num_attention_heads"]) * 4
    )
    return sequences * max_len * per_token


def random_text(rng: random.Random, length: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(length))


def long_rows(count: int, prompt_tokens: int, seed: int = 0) -> list[dict]:
    """``count`` rows of a ``prompt_tokens``-character prompt and a one-character answer (prefix_match)."""
    rng = random.Random(seed)
    return [{"prompt": random_text(rng, prompt_tokens), "answer": rng.choice(string.digits)} for _ in range(count)]


def datamodule(path: str, prompts: int, prompt_tokens: int, steps: int):
    """The digit task (``prompt_tokens`` 0) or ``steps`` x ``prompts`` long prompts, no validation."""
    from lightning_grpo import PromptDataModule
    from lightning_grpo.data.sources import Rows
    from lightning_grpo.data.tasks import DigitTask

    if not prompt_tokens:
        return PromptDataModule(DigitTask(), tokenizer_path=path, batch_size=prompts)
    rows = long_rows(prompts * (steps + 1), prompt_tokens)
    return PromptDataModule(source=Rows(rows), tokenizer_path=path, batch_size=prompts)
