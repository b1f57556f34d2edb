"""The code, tests, benchmarks, recipes and docs say what things are, not how they came to be: no issue or
pull-request numbers, commit hashes, source-article citations, "renamed from" / "previously" wording or lent
machines. Checksums of downloaded files (a 64-hex sha256) and cache keys (12 hex) are not history."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("lightning_grpo", "tests", "benchmarks", "recipes", "docs", "scripts")
SUFFIXES = {".md", ".py", ".yaml", ".yml", ".txt", ".sh", ".toml"}
HISTORY = re.compile(
    r"\b(issues? #?[0-9]+|PR #?[0-9]+|pull request #?[0-9]+|commit:? [0-9a-f]{7,40}"
    r"|seed 00[0-4]|(?:source|seed) articles?|lent"
    r"|renamed (?:from|in)|was renamed|previously|formerly|used to be|before this release|before the fix)\b"
    r"|(?<![0-9a-fA-F])[0-9a-f]{40}(?![0-9a-fA-F])",  # a full commit hash: exactly 40 hex digits
    flags=re.I,
)


def history_lines(paths, root: Path = ROOT) -> list[str]:
    """``path:line: text`` (the path relative to ``root``) for every line of ``paths`` that tells project history."""
    return [
        f"{path.relative_to(root)}:{n}: {line.strip()[:100]}"
        for path in paths
        if path.is_file() and path.suffix in SUFFIXES and "__pycache__" not in path.parts
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if HISTORY.search(line)
    ]


def test_the_repository_tells_no_project_history():
    here = Path(__file__).resolve()  # this file names what it looks for
    paths = [ROOT / "README.md", ROOT / "pyproject.toml", *(p for top in TOPS for p in (ROOT / top).rglob("*"))]
    paths = [p for p in paths if p.resolve() != here]
    assert len(paths) > 500  # the walk reached every top folder
    found = history_lines(paths)
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "line",
    [
        "see issue 49 for the plan",
        "Fixed in Issue #7",
        "landed as PR #12",
        "(commit fdecbf7)",
        "at " + "ab12" * 10,  # a full commit hash
        "model.dtype was renamed in 0.1.0",
        "renamed from model.dtype",
        "this was previously a flag",
        "symptom (seed 003)",
        "cites the source articles",
    ],
)
def test_history_in_a_file_is_found_with_its_line(tmp_path, line):
    path = tmp_path / "page.md"
    path.write_text("a plain first line\n" + line + "\n")
    assert history_lines([path], root=tmp_path) == [f"page.md:2: {line}"]


@pytest.mark.parametrize(
    "line",
    [
        'wheel_sha256="' + "bcc8" * 16 + '"',  # a pinned download checksum
        'SEED0_KEYS = {"chars": "' + "18e023254e94" + '"}',  # a cache key
        "revision: branch, tag or commit of a hub dataset",
        "a tensor skipped, renamed or rounded away",
        "the recipe was fixed on seed 0 before any run",
        "seed 0, seed 1 and seed 2",
        "an issue with the tokenizer",
    ],
)
def test_plain_text_is_not_taken_for_history(line):
    assert not HISTORY.search(line)
