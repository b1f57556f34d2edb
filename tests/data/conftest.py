"""Fixtures of the data-layer tests."""

from __future__ import annotations

import pytest

from lightning_grpo.data.datamodule import PromptDataModule
from lightning_grpo.data.sources import FileShortcut


@pytest.fixture
def make_dm(tiny_model_path, tmp_path):
    """``make_dm(**kwargs)``: a PromptDataModule on the tiny model's tokenizer (batch size 2), set up for fit.

    ``train_files`` / ``val_files`` / ``test_files`` are read with a ``datasets`` cache in ``tmp_path``."""

    def make(**kwargs) -> PromptDataModule:
        kwargs.setdefault("tokenizer_path", str(tiny_model_path))
        kwargs.setdefault("batch_size", 2)
        if "train_files" in kwargs:
            files = [kwargs.pop(f"{split}_files", None) for split in ("train", "val", "test")]
            kwargs["source"] = FileShortcut(*files, cache_dir=str(tmp_path / "hf-cache"))
        dm = PromptDataModule(**kwargs)
        dm.setup("fit")
        return dm

    return make
