"""Data: prompts, tasks and rewards (what is asked and how answers are scored).

Sources and the datamodule (:mod:`.sources`, :mod:`.tasks`, :mod:`.datamodule`, :mod:`.records`,
:mod:`.schedule`), supervised examples with assistant-only loss masks (:mod:`.sft`,
:mod:`.sft_format`), the reward registry (:mod:`.registry`) and the built-in, model-backed
and reasoning-gym rewards registered in it, and the reward set that calls them (:mod:`.reward_set`).

May import: ``core``, ``models`` (the tiny tokenizer). Knows neither the rollout engines nor the
trainer's callbacks (the import-linter contracts in pyproject.toml).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "PromptDataModule": "lightning_grpo.data.datamodule",
    "SFTDataModule": "lightning_grpo.data.sft",
    "PromptFormat": "lightning_grpo.data.records",
    "DataSource": "lightning_grpo.data.sources",
    "DigitTask": "lightning_grpo.data.tasks",
    "Files": "lightning_grpo.data.sources",
    "Rows": "lightning_grpo.data.sources",
    "HubDataset": "lightning_grpo.data.sources",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lightning_grpo.data' has no attribute {name!r}")
