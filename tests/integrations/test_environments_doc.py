"""docs/guide/environments.md's examples run as written (the verifiers one in the verifiers venv)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "guide" / "environments.md"


def examples() -> dict[str, str]:
    """The page's python blocks by the adapter module they import."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    found = {re.search(r"lightning_grpo\.integrations\.(\w+) import", b).group(1): b for b in blocks}
    assert sorted(found) == ["openenv", "trl", "verifiers"] and len(blocks) == 3
    return found


@pytest.mark.parametrize("name", ["openenv", "trl"])
def test_example_runs(name):
    if name == "openenv":
        pytest.importorskip("openenv")  # the dev extra installs openenv-core
    exec(compile(examples()[name], f"docs/guide/environments.md ({name})", "exec"), {"__name__": f"{name}_example"})


@pytest.mark.verifiers
def test_verifiers_example_runs():
    exec(
        compile(examples()["verifiers"], "docs/guide/environments.md (verifiers)", "exec"),
        {"__name__": "verifiers_example"},
    )
