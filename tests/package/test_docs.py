"""The docs' code examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def test_algorithms_worked_example_runs():
    blocks = python_blocks(DOCS / "algorithms.md")
    assert blocks, "docs/algorithms.md has no python example"
    for block in blocks:
        exec(compile(block, "docs/algorithms.md", "exec"), {})


def test_every_registered_name_is_documented():
    from lightning_grpo.core import REGISTRIES

    text = (DOCS / "algorithms.md").read_text()
    missing = [f"{kind}:{name}" for kind, reg in REGISTRIES.items() for name in reg.names() if f"`{name}`" not in text]
    assert not missing, f"names missing from docs/algorithms.md: {missing}"


def test_drop_in_examples_run(tmp_path, monkeypatch):
    monkeypatch.setenv("LIGHTNING_GRPO_CACHE", str(tmp_path / "cache"))
    blocks = python_blocks(DOCS / "drop-in.md")
    assert len(blocks) == 2
    for block in blocks:
        exec(compile(block, "docs/drop-in.md", "exec"), {"__name__": "drop_in_example"})


def test_stability_page_names_every_guard_and_only_existing_tests():
    import lightning_grpo
    from lightning_grpo.callbacks.guards import Guard

    text = (DOCS / "stability.md").read_text()
    guards = [n for n in lightning_grpo.__all__ if n.endswith("Guard")]
    assert len(guards) == 9 and all(issubclass(getattr(lightning_grpo, n), Guard) for n in guards)
    for name in guards:
        assert f"`{name}" in text, f"docs/stability.md does not describe {name}"
    tests_dir = DOCS.parent / "tests"
    defined = {m for f in tests_dir.rglob("test_*.py") for m in re.findall(r"^def (test_\w+)", f.read_text(), re.M)}
    cited = set(re.findall(r"\b(test_\w+)(?:`|::|,)", text))
    cited = {c for c in cited if not c.endswith(".py") and c != "test_bad_input"}
    assert cited and cited <= defined, sorted(cited - defined)


def test_agents_custom_environment_example_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("LIGHTNING_GRPO_CACHE", str(tmp_path / "cache"))
    blocks = python_blocks(DOCS / "agents.md")
    assert len(blocks) == 1
    env_class = blocks[0].split("class HigherLower")[1].split("\n\n\n")[0]
    assert len(env_class.splitlines()) <= 30  # "a 30-line custom environment"
    exec(compile(blocks[0], "docs/agents.md", "exec"), {"__name__": "agents_example"})


#: verl's default ``actor.clip_ratio_c`` (``ActorConfig`` / ``actor.yaml``), which both its dual-clip
#: PPO and its DPPO losses read.
VERL_CLIP_RATIO_C = "3.0"


def test_every_clip_ratio_c_row_of_the_algorithms_table_says_verls_default():
    """A loss-table row that cites verl and gives ``clip_ratio_c`` must state verl's default (3.0)
    beside ours, so no row passes our own value (DPPO's 20) off as verl's."""
    rows = [line for line in (DOCS / "algorithms.md").read_text().splitlines()
            if line.startswith("|") and "clip_ratio_c" in line and "verl" in line]  # fmt: skip
    assert len(rows) >= 3  # dual-clip, DPPO binary-TV, DPPO binary-KL
    for row in rows:
        assert VERL_CLIP_RATIO_C in row, row
