"""The docs' code examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs" / "guide"


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def test_algorithms_worked_example_runs():
    blocks = python_blocks(DOCS / "algorithms.md")
    assert blocks, "docs/guide/algorithms.md has no python example"
    for block in blocks:
        exec(compile(block, "docs/guide/algorithms.md", "exec"), {})


def test_every_registered_name_is_documented():
    from lightning_grpo.core import REGISTRIES

    text = (DOCS / "algorithms.md").read_text()
    missing = [f"{kind}:{name}" for kind, reg in REGISTRIES.items() for name in reg.names() if f"`{name}`" not in text]
    assert not missing, f"names missing from docs/guide/algorithms.md: {missing}"


def test_drop_in_examples_run(tmp_path, monkeypatch):
    monkeypatch.setenv("LIGHTNING_GRPO_CACHE", str(tmp_path / "cache"))
    blocks = python_blocks(DOCS / "get-started.md")
    assert blocks, "docs/guide/get-started.md has no python example"
    for block in blocks:
        exec(compile(block, "docs/guide/get-started.md", "exec"), {"__name__": "drop_in_example"})


def test_agents_custom_environment_example_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("LIGHTNING_GRPO_CACHE", str(tmp_path / "cache"))
    blocks = python_blocks(DOCS / "agents.md")
    assert blocks, "docs/guide/agents.md has no python example"
    exec(compile(blocks[0], "docs/guide/agents.md", "exec"), {"__name__": "agents_example"})
