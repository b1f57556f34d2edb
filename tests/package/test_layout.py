"""The package's folders are its layers. Which folder may import which (and that no module imports
itself back, and that ``core`` imports torch only) is import-linter's: the contracts in
pyproject.toml ``[tool.importlinter]``, checked by ``lint-imports``. Here: every folder says what it
holds, and the API reference's "Layout" (docs/reference/index.md) lists exactly the folders there are, in the layer order."""

from __future__ import annotations

import ast
import re
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "lightning_grpo"


def layers() -> list[str]:
    """The folders of the layers contract, bottom first (siblings ``a | b`` as ``b``, ``a``)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["id"] == "layers"]
    return [name.strip() for layer in reversed(contract["layers"]) for name in reversed(layer.split("|"))]


def test_every_folder_is_a_layer_with_a_docstring():
    folders = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert folders == set(layers())
    for folder in sorted(folders):
        doc = ast.get_docstring(ast.parse((PACKAGE / folder / "__init__.py").read_text()))
        assert doc, f"lightning_grpo/{folder}/__init__.py has no docstring saying what it holds"


def layout_folders(text: str) -> list[str]:
    """The folders of lightning_grpo/ that the API reference's "Layout" (docs/reference/index.md) code block lists."""
    section = text.split("## Layout\n", 1)[1]
    block = section.split("```", 2)[1]
    return re.findall(r"^  (\w+)/", block, flags=re.M)


def test_the_reference_layout_lists_the_folders_there_are():
    listed = layout_folders((ROOT / "docs" / "reference" / "index.md").read_text())
    real = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
    assert sorted(listed) == real, f"docs/reference/index.md Layout lists {sorted(listed)}, lightning_grpo/ has {real}"
    assert len(listed) == len(set(listed))
    assert listed == layers(), (
        "docs/reference/index.md lists the folders in the layer order of pyproject.toml [tool.importlinter]"
    )
