"""Fixtures of the end-to-end runs."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def tiny_cache(tiny_model_path, monkeypatch):
    """Point the package's tiny-model cache at the session's copy (no second build, no ~/.cache)."""
    monkeypatch.setenv("LIGHTNING_GRPO_CACHE", str(Path(tiny_model_path).parent))
