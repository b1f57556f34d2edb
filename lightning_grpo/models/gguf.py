"""A ``.gguf`` file as a model source: dequantised once into a plain model folder in the cache.

``model.model`` may name a GGUF file (``SmolLM2-135M-Instruct.Q4_1.gguf``) or a folder holding one (and no
``config.json``). transformers reads it (the ``gguf`` package: ``pip install 'lightning-grpo[gguf]'``) into a
float32 model with its tokenizer and chat template; the model's GGUF quantizer mark is cleared and the result is
saved as an ordinary Hugging Face folder under ``<cache>/gguf/<file stem>-<sha256 prefix>/``
(:func:`~lightning_grpo.models.cache.default_cache_dir`). Everything downstream (the vLLM engine, export, serve,
resume) sees that folder. The folder is keyed by the file's content, so an edited file is converted again, and it
is written to a temporary sibling renamed into place (a crash never leaves half a model). Converting a 135M model
takes about 20 s and its folder holds about 540 MB (float32).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from .cache import default_cache_dir, save_once

SUFFIX = ".gguf"


def gguf_file_of(source: str) -> Path | None:
    """The GGUF file ``source`` names: the file itself, or the only ``.gguf`` file of a folder that holds no
    ``config.json``; None when ``source`` names no GGUF (a model folder, a hub id, ...). A folder holding several
    ``.gguf`` files is refused in one line naming them."""
    path = Path(source).expanduser()
    if path.suffix.lower() == SUFFIX:
        if not path.is_file():
            raise FileNotFoundError(f"model.model: {source} names a GGUF file that does not exist")
        return path
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    found = sorted(path.glob(f"*{SUFFIX}"))
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise ValueError(f"model.model: {source} holds several GGUF files ({names}): name the file to train")
    return found[0] if found else None


def content_key(path: Path, length: int = 16) -> str:
    """The first ``length`` hex digits of the file's sha256."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()[:length]


def dequantized_folder(gguf: Path, cache_dir: Path | None = None) -> Path:
    """The plain float32 model folder of ``gguf`` (built on first use; see the module docstring)."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / "gguf" / f"{gguf.stem}-{content_key(gguf)}"
    return save_once(target, lambda: load_dequantized(gguf))


def load_dequantized(gguf: Path):
    """(model, tokenizer) read from ``gguf`` by transformers, the model made saveable as a plain folder."""
    try:
        import gguf as _gguf  # noqa: F401 - transformers needs it to read the file
    except ImportError:
        raise ImportError(
            f"model.model: reading {gguf} needs the gguf package: pip install 'lightning-grpo[gguf]'"
        ) from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # transformers marks a model read from GGUF as quantized and refuses to save it: the weights are plain floats now
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):  # a transformers / peft / bitsandbytes object (third-party)
        del model.config.quantization_config
    return model, tokenizer
