"""The one rule for "is this name a local path or a Hugging Face hub id?" (models, tokenizers, datasets)."""

from __future__ import annotations

from pathlib import Path


def is_local_path(name: str) -> bool:
    """True when ``name`` means a local path, False when it is a hub id (``"org/name"`` or ``"name"``).

    A name is a local path when it exists on disk (after ``~`` expansion), or when it is written as one:
    absolute, starting with ``.`` or ``~``, with more than one ``/``, or ``"folder/name"`` whose first
    part is a local folder. Anything else is a hub id, fetched (or reported missing) by the hub client.
    """
    if name.startswith((".", "/", "~")) or name.count("/") > 1 or Path(name).expanduser().exists():
        return True
    return name.count("/") == 1 and Path(name.split("/", 1)[0]).is_dir()
