"""The docs' code examples run as written. A ```python block marked ``<!-- runnable -->`` on the line before
it runs here, in a temporary folder, with any ``max_steps=N`` cut to 2 steps (marked slow when it trains);
every other block is run by its page's own test (``OWN_TESTS``). A new block that is neither fails
``test_every_python_block_runs_somewhere``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
MARK = "<!-- runnable -->"
# pages whose python blocks need more than an exec (a server, a section's setup): their own tests run them
OWN_TESTS = {
    "guide/data.md": "tests/data/test_data_docs.py",
    "guide/reward-models.md": "tests/data/test_reward_models_docs.py",
    "guide/environments.md": "tests/integrations/test_environments_doc.py",
}


def python_blocks(path: Path) -> list[tuple[bool, str]]:
    """(marked runnable, code) for each ```python block of the page."""
    found = re.findall(r"(?:^([^\n]*)\n)?```python\n(.*?)```", path.read_text(), flags=re.S | re.M)
    return [(before.strip() == MARK, code) for before, code in found]


def runnable() -> list:
    return [
        pytest.param(
            str(page.relative_to(DOCS)),
            i,
            code,
            id=f"{page.relative_to(DOCS)}-{i}",
            marks=[pytest.mark.slow] if ".fit(" in code else [],  # a block that trains is an end-to-end run
        )
        for page in sorted(DOCS.rglob("*.md"))
        for i, (marked, code) in enumerate(python_blocks(page))
        if marked
    ]


def test_every_python_block_runs_somewhere():
    unrun = [
        f"docs/{page.relative_to(DOCS)} block {i}"
        for page in sorted(DOCS.rglob("*.md"))
        for i, (marked, _) in enumerate(python_blocks(page))
        if not marked and str(page.relative_to(DOCS)) not in OWN_TESTS
    ]
    assert not unrun, f"mark these {MARK} (or run them in the page's own test): {unrun}"
    assert {"guide/get-started.md", "guide/algorithms.md", "guide/agents.md"} <= {p.values[0] for p in runnable()}


@pytest.mark.parametrize(("page", "index", "code"), runnable())
def test_runnable_block(page, index, code, tmp_path, monkeypatch, tiny_cache):
    monkeypatch.chdir(tmp_path)
    short = re.sub(r"max_steps=\d+", "max_steps=2", code)
    exec(compile(short, f"docs/{page} (block {index})", "exec"), {"__name__": "docs_example"})


def test_every_registered_name_is_documented():
    from lightning_grpo.core import REGISTRIES

    text = (DOCS / "guide" / "algorithms.md").read_text()
    missing = [f"{kind}:{name}" for kind, reg in REGISTRIES.items() for name in reg.names() if f"`{name}`" not in text]
    assert not missing, f"names missing from docs/guide/algorithms.md: {missing}"


@pytest.mark.parametrize("name", sorted(n for n in __import__("lightning_grpo").__all__ if n != "__version__"))
def test_the_public_docstrings_are_google_style_and_their_examples_compile(name):
    """The API reference renders these (mkdocstrings, Google style): no Sphinx roles, and each Example compiles."""
    import inspect

    import lightning_grpo

    doc = inspect.getdoc(getattr(lightning_grpo, name)) or ""
    assert doc, f"lightning_grpo.{name} has no docstring"
    roles = re.findall(r":(?:class|func|meth|attr|data|mod|exc):`", doc)
    assert not roles, f"lightning_grpo.{name}: Sphinx roles render as text in the API reference; use `Name`"
    for code in re.findall(r"```python\n(.*?)```", doc, flags=re.S):
        compile(inspect.cleandoc(code), f"lightning_grpo.{name} Example", "exec")


def test_mkdocs_yml_quiets_the_theme_notice_and_names_existing_stylesheets():
    """Reading mkdocs.yml sets NO_MKDOCS_2_WARNING before the Material theme loads (no 10-line notice at each build),
    and every ``extra_css`` file it names is in docs/."""
    import os
    import subprocess
    import sys

    pytest.importorskip("mkdocs")
    code = (
        "import os; from mkdocs.utils.yaml import yaml_load; config = yaml_load(open('mkdocs.yml'));"
        "print(os.environ.get('NO_MKDOCS_2_WARNING'), *config['extra_css'])"
    )
    env = {k: v for k, v in os.environ.items() if k != "NO_MKDOCS_2_WARNING"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=DOCS.parent, env=env, capture_output=True, text=True, check=True
    )
    flag, *stylesheets = out.stdout.split()
    assert flag == "1", out.stdout
    assert stylesheets and all((DOCS / path).is_file() for path in stylesheets), stylesheets
