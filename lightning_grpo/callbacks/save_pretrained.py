"""SavePretrained: write the trained policy and its tokenizer as a Hugging Face model directory.

At the end of ``fit`` (rank 0), ``policy.save_pretrained(dirpath)`` and
``tokenizer.save_pretrained(dirpath)``, so the directory loads with ``AutoModelForCausalLM`` /
``AutoTokenizer``: a teacher for on-policy distillation, a model for vLLM, a start for the next run.
A LoRA policy is saved merged (``merge_lora``: a plain model directory) or as its adapter.

    lightning-grpo fit -c recipes/quickstart.yaml \\
        --trainer.callbacks+=lightning_grpo.SavePretrained --trainer.callbacks.dirpath=runs/distill_teacher
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback
from typing_extensions import override


class SavePretrained(Callback):
    """Save ``pl_module.policy`` and the data module's tokenizer to ``dirpath`` when training ends.

    Args:
        dirpath: the directory to write (replaced whole: a half-written directory never stays).
        merge_lora: with a peft (LoRA) policy, save the merged model (True) or the adapter alone.
    """

    def __init__(self, dirpath: str, merge_lora: bool = True) -> None:
        if not dirpath:
            raise ValueError("SavePretrained.dirpath must name the directory to write")
        self.dirpath = Path(dirpath)
        self.merge_lora = merge_lora

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Refuse, before training, a ``dirpath`` that holds something other than a saved model (it is replaced whole)."""
        path = self.dirpath
        if path.exists() and (not path.is_dir() or (any(path.iterdir()) and not (path / "config.json").exists())):
            raise ValueError(
                f"SavePretrained.dirpath {str(path)!r} exists and is not a saved model directory (no config.json); "
                "it would be replaced whole: choose another directory (not the logger's)"
            )

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        policy = pl_module.policy
        if self.merge_lora and hasattr(policy, "merge_and_unload"):
            import copy

            policy = copy.deepcopy(policy).merge_and_unload()
        tmp = self.dirpath.with_name(f".tmp-{self.dirpath.name}-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        policy.save_pretrained(tmp)
        tokenizer = getattr(trainer.datamodule, "tokenizer", None)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        shutil.rmtree(self.dirpath, ignore_errors=True)
        self.dirpath.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, self.dirpath)
