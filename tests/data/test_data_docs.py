"""docs/guide/data.md runs as written: its Python examples execute, its YAML parses with the CLI parser."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from unittest import mock

import pytest
import yaml

DOC = Path(__file__).resolve().parents[2] / "docs" / "guide" / "data.md"
#: The sections of this area (others add their own sections, with their own tests).
SECTIONS = [
    "Files",
    "HubDataset: hub ids and local dataset folders",
    "Chat-message prompts",
    "The mapping hook",
    "Extra columns reach the reward functions",
    "TRL-style reward functions",
]


def section(title: str) -> str:
    text = DOC.read_text()
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert match, f"docs/guide/data.md has no section '## {title}'"
    return match.group(1)


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


@pytest.fixture
def sandbox(tmp_path, monkeypatch, tiny_model_path):
    """A fresh working folder, the session's tiny model, a private datasets cache."""
    import datasets

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LIGHTNING_GRPO_CACHE", str(Path(tiny_model_path).parent))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    return tmp_path


@pytest.mark.parametrize("title", SECTIONS)
def test_python_examples_run(title, sandbox):
    code = blocks(section(title), "python")
    assert code, f"section '{title}' has no python example"
    for block in code:
        exec(compile(block, f"docs/guide/data.md ({title})", "exec"), {"__name__": "data_docs_example"})


@pytest.mark.parametrize("title", [t for t in SECTIONS if blocks(section(t), "yaml")])
def test_yaml_examples_parse(title, sandbox):
    from lightning_grpo.cli import GRPOCLI, build_cli

    class ParseOnly(GRPOCLI):
        def instantiate_classes(self) -> None:
            pass

    for i, block in enumerate(blocks(section(title), "yaml")):
        path = sandbox / f"snippet{i}.yaml"
        path.write_text(block)
        with mock.patch.object(sys, "argv", ["lightning-grpo"]):
            config = build_cli(["--model.model", "tiny:chars", "-c", str(path)], run=False, cli_class=ParseOnly).config
        assert_within(yaml.safe_load(block), config.as_dict())


def assert_within(written, parsed, where: str = "") -> None:
    """Every value the snippet writes is in the parsed config, at the same place."""
    if isinstance(written, dict):
        if isinstance(parsed, dict) and "init_args" in parsed and "class_path" not in written:
            parsed = parsed[
                "init_args"
            ]  # a section written as its options alone (rollout:) parses to class_path / init_args
        for key, value in written.items():
            assert isinstance(parsed, dict) and key in parsed, f"{where}.{key} missing from the parsed config"
            assert_within(value, parsed[key], f"{where}.{key}")
    elif isinstance(written, list):
        assert isinstance(parsed, list) and len(parsed) == len(written), where
        for i, (w, p) in enumerate(zip(written, parsed)):
            assert_within(w, p, f"{where}[{i}]")
    else:
        assert parsed == written, f"{where}: parsed {parsed!r}, written {written!r}"
