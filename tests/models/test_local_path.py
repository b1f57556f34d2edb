"""The one rule for "a local path or a hub id?" (lightning_grpo/models/hub.py), used by the data sources,
the engine factory, the model check and the distillation teacher."""

from __future__ import annotations

import pytest

from lightning_grpo.models.hub import is_local_path


@pytest.mark.parametrize(
    ("name", "local"),
    [
        ("Qwen/Qwen2.5-0.5B-Instruct", False),  # org/name: a hub id
        ("gpt2", False),  # name: a hub id
        ("openai/gsm8k", False),
        ("./model", True),
        ("../model", True),
        ("~/model", True),
        ("/abs/model", True),  # written as paths
        ("runs/a/b", True),  # more than one "/": no hub id has that shape
    ],
)
def test_names_by_their_shape(name, local, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no folder of these names here
    assert is_local_path(name) is local


def test_names_that_exist_or_sit_in_a_local_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model").mkdir()
    (tmp_path / "runs").mkdir()
    assert is_local_path("model") is True  # exists, though shaped like a hub name
    assert is_local_path("runs/missing") is True  # "folder/name" whose folder is here: a path, reported missing
    assert is_local_path("org/missing") is False  # no folder "org": a hub id
