"""A tiny Qwen2-style policy and a character-level tokenizer, built locally and cached.

The quickstart and the tests never download weights: :func:`tiny_model_dir` trains a
character-level tokenizer with the ``tokenizers`` library and saves a randomly initialised
Qwen2 model next to it, once per configuration, under the user's cache directory.

``model.model: tiny:<variant>`` (or ``null``, the ``chars`` variant) is the built-in model
(:func:`builtin_model_path`): its initial weights come from the run's seed (``seed_everything``),
so each seed of a seed table starts from its own initialisation; ``tiny:<variant>@<seed>`` pins them.
Seed 0 keeps the folder and weights the built-in model had before the seed was used.
"""

from __future__ import annotations

import hashlib
import json
import os
import string
from dataclasses import asdict, dataclass
from pathlib import Path

from .cache import default_cache_dir, save_once

#: Special tokens first so their ids are fixed: pad = 0, eos = 1.
SPECIAL_TOKENS = ["<pad>", "<eos>", "<unk>", "<|im_start|>", "<|im_end|>"]
#: Digits, '=', lowercase letters, a space and a little punctuation: every character is one token.
ALPHABET = list(string.digits) + ["="] + list(string.ascii_lowercase) + [" ", "\n", ":", "+", "-", "."]

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


#: The ``tools`` variant: ChatML with tool support (Qwen2.5 / Hermes layout: tools announced in a
#: system message, calls as ``<tool_call>`` JSON, results as ``<tool_response>`` in a user turn).
#: Tools are listed by name only, to keep tiny prompts short.
CHATML_TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\ntools:{% for tool in tools %} {{ tool.function.name }}{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response><|im_end|>\n"
    "{% elif message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant\n{{ message.content or '' }}"
    '{% for call in message.tool_calls %}<tool_call>\n{"name": "{{ call.function.name }}", "arguments": '
    "{{ call.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: Extra characters of the ``tools`` variant (JSON and tool names).
TOOLS_ALPHABET = list('_{}[]",') + list(string.ascii_uppercase)
#: Extra characters of the ``text`` variant: the rest of printable ASCII (upper case, all punctuation),
#: so that any English task text (reasoning-gym questions) is spelled without dropping a character.
TEXT_ALPHABET = list(string.ascii_uppercase) + [c for c in string.punctuation if c not in ALPHABET]
#: Whole strings that the ``text`` variant spells as one token each: the fixed instruction of reasoning-gym's
#: spell_backward questions (``"Spell this word backward (example: sun -> nus): cat"`` is 4 tokens, not 51), as
#: a real BPE vocabulary spells frequent text in a few tokens (recipes/reasoning_gym_quickstart.yaml).
TEXT_WORDS = ["Spell this word backward (example: sun -> nus): "]
#: Tokenizer variant -> the characters it adds to :data:`ALPHABET`.
VARIANT_ALPHABETS = {"chars": [], "tools": TOOLS_ALPHABET, "text": TEXT_ALPHABET}
#: Names after ``tiny:``: the character-level variants, and ``qwen3`` / ``qwen3-untied`` / ``qwen3-untied-8h`` (a tiny
#: Qwen3 on the real Qwen3 tokenizer, its LM head tied to the embedding or its own; 8h: 8 attention heads of 32, not 2:
#: :mod:`lightning_grpo.models.tiny_qwen3`).
_UNTIED = {"tie_word_embeddings": False, "embedding_std": 1.0}
QWEN3_VARIANTS = {
    "qwen3": {},
    "qwen3-untied": _UNTIED,
    "qwen3-untied-8h": {**_UNTIED, "num_attention_heads": 8, "num_key_value_heads": 8},
}  # -> TinyQwen3Config
BUILTIN_VARIANTS = [*VARIANT_ALPHABETS, *QWEN3_VARIANTS]
#: Whole strings that the ``tools`` variant spells as one token each, as a real BPE vocabulary spells
#: frequent strings: the chat roles, the Hermes markers, and the complete call of the built-in secret-digit tool, so
#: that a random 88K-parameter model can sample a well-formed call (lightning_grpo.agents.secret_digit).
TOOLS_WORDS = [
    "system",
    "user",
    "assistant",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    '<tool_call>\n{"name": "secret_digit", "arguments": {}}\n</tool_call>',
]


@dataclass(frozen=True)
class TinyModelConfig:
    """Shape of the tiny Qwen2 policy. head_dim = hidden_size / num_attention_heads must be one
    of vLLM's supported sizes (32, 64, 80, ...), hence 2 heads of 32 at hidden 64."""

    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 2
    intermediate_size: int = 128
    max_position_embeddings: int = 512
    initializer_range: float = 0.02
    tie_word_embeddings: bool = False
    seed: int = 0
    tokenizer: str = "chars"
    """"chars" (character level, plain ChatML), "tools" (more characters, ChatML with tool
    support, Hermes markers as tokens: :data:`CHATML_TOOLS_TEMPLATE`) or "text" (every printable
    ASCII character, plain ChatML)."""

    def key(self) -> str:
        fields = asdict(self)
        if fields["tokenizer"] == "chars":  # the original key of the default tokenizer
            del fields["tokenizer"]
        elif fields["tokenizer"] == "tools":  # the tools vocabulary changed once (role words added)
            fields["tokenizer_version"] = 2
        else:  # a vocabulary change gives another directory
            fields["words"] = TEXT_WORDS
        blob = json.dumps(fields, sort_keys=True) + "|v2"
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def build_char_tokenizer(variant: str = "chars"):
    """A character-level tokenizer: one token per character of :data:`ALPHABET` (fixed ids);
    characters outside it are dropped. ``variant="tools"`` adds :data:`TOOLS_ALPHABET`, the
    :data:`TOOLS_WORDS` as single tokens and the tool-aware chat template; ``variant="text"`` adds
    :data:`TEXT_ALPHABET` (all printable ASCII)."""
    if variant not in VARIANT_ALPHABETS:
        raise ValueError(f"tiny tokenizer variant must be one of {sorted(VARIANT_ALPHABETS)}, got {variant!r}")
    alphabet = ALPHABET + VARIANT_ALPHABETS[variant]
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    # Byte-level spelling of each character (space -> "Ġ", newline -> "Ċ") with no merges: the
    # layout transformers' Qwen2Tokenizer rebuilds from tokenizer.json, so the saved tokenizer
    # encodes the same ids whether it is loaded as Qwen2Tokenizer or PreTrainedTokenizerFast.
    byte_char = bytes_to_unicode()
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}  # fixed ids: pad 0, eos 1
    vocab.update({byte_char[ord(c)]: len(SPECIAL_TOKENS) + i for i, c in enumerate(alphabet)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    words = {"tools": TOOLS_WORDS, "text": TEXT_WORDS}.get(variant, [])
    if words:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in words])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        chat_template=CHATML_TOOLS_TEMPLATE if variant == "tools" else CHATML_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def qwen2_config(config: TinyModelConfig, vocab_size: int, pad_token_id: int, eos_token_id: int, **overrides):
    """The ``transformers.Qwen2Config`` of ``config``'s shape (``overrides`` replace any field)."""
    from transformers import Qwen2Config

    fields = dict(
        vocab_size=vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        intermediate_size=config.intermediate_size,
        max_position_embeddings=config.max_position_embeddings,
        initializer_range=config.initializer_range,
        tie_word_embeddings=config.tie_word_embeddings,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=None,
        torch_dtype="float32",
    )
    return Qwen2Config(**{**fields, **overrides})


def build_tiny_model(config: TinyModelConfig, vocab_size: int, pad_token_id: int, eos_token_id: int):
    """A randomly initialised ``Qwen2ForCausalLM`` of the given shape (float32, train mode)."""
    import torch
    from transformers import Qwen2ForCausalLM

    hf_config = qwen2_config(config, vocab_size, pad_token_id, eos_token_id)
    with torch.random.fork_rng():
        torch.manual_seed(config.seed)
        model = Qwen2ForCausalLM(hf_config)
    return model.train()


def tiny_model_dir(config: TinyModelConfig | None = None, cache_dir: str | os.PathLike | None = None) -> Path:
    """Directory holding the tiny model and its tokenizer; built on first use, then reused.

    The directory name is a hash of the configuration, so different shapes never collide.
    Writing goes to a temporary sibling that is renamed into place, so a crash never leaves
    a half-written model behind.
    """
    config = config or TinyModelConfig()
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()

    def build():
        tokenizer = build_char_tokenizer(config.tokenizer)
        return build_tiny_model(config, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id), tokenizer

    return save_once(root / f"tiny-qwen2-{config.key()}", build)


#: ``model.model`` / ``data.tokenizer_path`` values naming a built-in tiny model: ``"tiny:chars"``, ``"tiny:tools"``,
#: optionally with a pinned initialisation seed: ``"tiny:chars@3"``.
BUILTIN_PREFIX = "tiny:"


def run_seed() -> int:
    """The run's seed: the value ``lightning.seed_everything`` stored in ``$PL_GLOBAL_SEED`` (LightningCLI's
    ``seed_everything``, set before any class is built, and inherited by DDP ranks and subprocesses), else 0."""
    return int(os.environ.get("PL_GLOBAL_SEED", 0))


def parse_builtin(source: str, field: str = "model.model") -> tuple[str, int | None]:
    """``"tiny:<variant>[@<seed>]"`` -> (variant, pinned seed or None); one error naming ``field`` otherwise."""
    variant, at, seed = source[len(BUILTIN_PREFIX) :].partition("@")
    if variant not in BUILTIN_VARIANTS or (at and not seed.isdigit()):
        raise ValueError(
            f"{field}: {source!r} is not a built-in tiny model; expected 'tiny:<variant>' or 'tiny:<variant>@<seed>' "
            f"with variant one of {sorted(BUILTIN_VARIANTS)} and seed a non-negative integer (e.g. 'tiny:chars@3')"
        )
    return variant, int(seed) if at else None


def builtin_model_path(source: str | None, field: str = "model.model") -> str | None:
    """The directory of a built-in tiny model named ``"tiny:<tokenizer variant>[@<seed>]"`` (built on first use);
    any other value unchanged. Its initial weights come from the pinned seed, else from the run's seed
    (:func:`run_seed`): each seed of a seed table starts from its own initialisation, seed 0 from the same
    weights (and directory) as before the seed was used."""
    if isinstance(source, str) and source.startswith(BUILTIN_PREFIX):
        variant, seed = parse_builtin(source, field)
        return str(_builtin_dir(variant, run_seed() if seed is None else seed))
    return source


def _builtin_dir(variant: str, seed: int) -> Path:
    if variant in QWEN3_VARIANTS:  # the real Qwen3 tokenizer (models/tiny_qwen3.py)
        from .tiny_qwen3 import TinyQwen3Config, tiny_qwen3_dir

        return tiny_qwen3_dir(TinyQwen3Config(**QWEN3_VARIANTS[variant], seed=seed))
    return tiny_model_dir(TinyModelConfig(tokenizer=variant, seed=seed))


def builtin_tokenizer_path(source: str | None, field: str = "data.tokenizer_path") -> str | None:
    """As :func:`builtin_model_path` for a tokenizer: the tokenizer does not depend on the seed, so a built-in
    name always gives the seed-0 directory (any ``@<seed>`` is checked and ignored)."""
    if isinstance(source, str) and source.startswith(BUILTIN_PREFIX):
        return str(_builtin_dir(parse_builtin(source, field)[0], 0))
    return source


def save_tiny_reward_model(
    directory: str | os.PathLike, num_labels: int = 1, seed: int = 0, padding_side: str = "right"
) -> Path:
    """Save a randomly initialised ``Qwen2ForSequenceClassification`` (the tiny policy's shape,
    ``num_labels`` outputs) and the character tokenizer (padding on ``padding_side``) into
    ``directory``: a stand-in reward model for the ``reward_model`` reward in examples and tests."""
    import torch
    from transformers import Qwen2ForSequenceClassification

    tokenizer = build_char_tokenizer()
    tokenizer.padding_side = padding_side
    tokenizer.init_kwargs["padding_side"] = padding_side  # saved in tokenizer_config.json
    config = qwen2_config(
        TinyModelConfig(seed=seed),
        len(tokenizer),
        tokenizer.pad_token_id,
        tokenizer.eos_token_id,
        initializer_range=0.5,  # a wide spread of scores, so that tests see differences
        num_labels=num_labels,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2ForSequenceClassification(config)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return Path(directory)
