"""Data files read as rows: the extensions and ``datasets`` builders supported, the checks that name the option
and the file before anything is read (missing, empty, mixed types, not UTF-8), and the reading itself."""

from __future__ import annotations

import codecs
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: File suffix -> ``datasets`` builder name.
SUPPORTED_EXTENSIONS: dict[str, str] = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def check_files(files: str | Sequence[str] | None, field: str) -> tuple[str, list[str]] | None:
    """(builder, paths) for ``files``; raises naming ``field`` and the file when one is unusable."""
    if files is None:
        return None
    paths = [files] if isinstance(files, (str, Path)) else list(files)
    if not paths:
        raise ValueError(f"{field} is an empty list; give at least one file")
    builders = set()
    for path in map(str, paths):
        suffix = Path(path).suffix.lower()
        if suffix not in SUPPORTED_EXTENSIONS:
            raise ValueError(
                f"{field}: unsupported file type {suffix or '(none)'!r} for {path}; "
                f"supported: {sorted(SUPPORTED_EXTENSIONS)}"
            )
        if not Path(path).is_file():
            raise FileNotFoundError(f"{field}: file not found: {path}")
        if Path(path).stat().st_size == 0:
            raise ValueError(f"{field}: {path} is empty (holds no rows)")
        builders.add(SUPPORTED_EXTENSIONS[suffix])
    if len(builders) > 1:
        raise ValueError(f"{field} mixes file types {sorted(builders)}; use one type per split")
    return builders.pop(), [str(p) for p in paths]


#: Builders of text formats, whose files must be UTF-8 (``datasets`` reads them so).
TEXT_BUILDERS = ("json", "csv")


def check_utf8(path: str, field: str, chunk_bytes: int = 1 << 20) -> None:
    """Raise naming ``field``, the file, the byte offset and the line of the first byte that is not
    UTF-8 (``datasets`` reports it without the file, or not at all); the file is read in chunks."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, lines = 0, 0  # bytes and newlines before the current chunk
    with open(path, "rb") as f:
        while True:
            chunk = f.read(chunk_bytes)
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as err:
                pending = len(err.object) - len(chunk)  # an unfinished character carried over (no newline in it)
                at = offset - pending + err.start
                line = lines + err.object[: err.start].count(b"\n") + 1
                raise ValueError(
                    f"{field}: {path} is not UTF-8 text: byte 0x{err.object[err.start]:02x} at offset {at} (line {line}); "
                    "re-save it as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
                ) from None
            if not chunk:
                return
            offset, lines = offset + len(chunk), lines + chunk.count(b"\n")


def read_files(
    builder: str, paths: list[str], cache_dir: str | None, field: str = "data files"
) -> list[dict[str, Any]]:
    """The rows of data files of one type, read with ``datasets.load_dataset(builder)``."""
    import datasets

    if builder in TEXT_BUILDERS:
        for path in paths:
            check_utf8(path, field)
    source = paths[0] if len(paths) == 1 else str(paths)
    try:
        data = datasets.load_dataset(builder, data_files=paths, split="train", cache_dir=cache_dir)
    except Exception as err:  # datasets raises many types; name the file
        located = next((m for m in map(json_error, paths) if m), None) if builder == "json" else None
        if located is not None:
            raise ValueError(f"{field}: {located}") from err
        raise ValueError(f"could not read {source} with datasets.load_dataset({builder!r}): {err}") from err
    return data.to_list()


def json_error(path: str) -> str | None:
    """``<path> line L, column C is not valid JSON: ...`` with the fix, for the first line of a ``.json`` /
    ``.jsonl`` file that does not parse (``datasets`` names only a byte position); None when it parses."""
    if Path(path).suffix.lower() not in (".json", ".jsonl"):
        return None
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    if Path(path).suffix.lower() == ".json":
        try:
            json.loads(text)
            return None
        except json.JSONDecodeError as err:
            if err.msg != "Extra data":  # one JSON document (not JSON Lines) that is broken
                return f"{path} line {err.lineno}, column {err.colno} is not valid JSON: {err.msg}; fix the file there"
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            what = f"{err.msg}: the line ends before its object is closed" if err.pos >= len(line.rstrip()) else err.msg
            return (
                f"{path} line {number}, column {err.colno} is not valid JSON: {what}; fix that line: each line "
                'must hold one JSON object, e.g. {"prompt": "12=", "answer": "3"} (strings in double quotes)'
            )
        if not isinstance(row, dict):
            return (
                f"{path} line {number} holds a JSON {type(row).__name__}, not an object; each line must hold one "
                'JSON object, e.g. {"prompt": "12=", "answer": "3"}'
            )
    return None
