"""The cache of built-in tiny models: where they live, and writing one once, atomically."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """``$LIGHTNING_GRPO_CACHE``, else ``$XDG_CACHE_HOME/lightning_grpo``, else ``~/.cache/lightning_grpo``."""
    if os.environ.get("LIGHTNING_GRPO_CACHE"):
        return Path(os.environ["LIGHTNING_GRPO_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lightning_grpo"


def save_once(target: Path, build) -> Path:
    """``target`` holding the model and tokenizer that ``build() -> (model, tokenizer)`` makes, built only when
    missing, written to a temporary sibling renamed into place (a crash never leaves half a model)."""
    if (target / "config.json").exists() and (target / "tokenizer.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".tmp-{target.name}-{os.getpid()}"
    model, tokenizer = build()
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    model.generation_config.save_pretrained(tmp)
    try:
        os.replace(tmp, target)
    except OSError:  # another process won the race: keep its copy
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return target
