"""SavePretrained: write the trained policy and its tokenizer as a Hugging Face model folder during
training, the same folder ``lightning-grpo export`` writes from a checkpoint (`lightning_grpo.models.export`).

``dirpath`` always holds the latest save (every ``every_n_steps`` optimizer steps, and at the end of
``fit``); with ``keep_last: K`` the K - 1 saves before it stay next to it as ``<dirpath>-step<N>``.
Each folder loads with ``AutoModelForCausalLM`` / ``AutoTokenizer`` and ``vllm.LLM``; a LoRA policy
is saved merged, or (``merge_lora: false``) as its peft adapter. Written on rank 0 (under FSDP2
every rank gathers the full weights first), next to its place and renamed into it.

    lightning-grpo fit -c recipes/quickstart.yaml \\
        --trainer.callbacks+=lightning_grpo.SavePretrained --trainer.callbacks.dirpath=runs/my_model
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Literal

import lightning as L
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from ..data.datamodule import PromptDataModule

#: Written into every saved folder: the optimizer step it holds.
STEP_FILE = "lightning_grpo_step.json"


class SavePretrained(Callback):
    """Save ``pl_module.policy`` and the data module's tokenizer as a model folder.

    Args:
        dirpath: the folder of the latest save (replaced whole at each save); None = ``model`` in the
            logger's run folder (``runs/<name>/version_N/model``).
        every_n_steps: also save every this many optimizer steps; 0 = only at the end of training.
        keep_last: saves kept: the latest in ``dirpath``, the ones before as ``<dirpath>-step<N>``.
        merge_lora: with a LoRA policy, save the merged model (True) or the adapter alone (peft format).
        dtype: cast the saved weights ("float32", "bfloat16", "float16"); None = as trained.

    Example:
        ```python
        import lightning as L
        from lightning_grpo import SavePretrained

        # a Hugging Face folder every 100 steps (version_N/model), the LoRA adapter merged, in bfloat16
        trainer = L.Trainer(callbacks=[SavePretrained(every_n_steps=100, dtype="bfloat16")])
        ```
    """

    def __init__(
        self,
        dirpath: str | None = None,
        every_n_steps: int = 0,
        keep_last: int = 1,
        merge_lora: bool = True,
        dtype: Literal["float32", "bfloat16", "float16"] | None = None,
    ) -> None:
        if dirpath is not None and not str(dirpath).strip():
            raise ValueError("SavePretrained.dirpath must name the directory to write (or be null: the run folder)")
        if not isinstance(every_n_steps, int) or every_n_steps < 0:
            raise ValueError(
                f"SavePretrained.every_n_steps must be an integer >= 0 (0 = at the end only), got {every_n_steps!r}"
            )
        if not isinstance(keep_last, int) or keep_last < 1:
            raise ValueError(f"SavePretrained.keep_last must be an integer >= 1, got {keep_last!r}")
        if dtype not in (None, "float32", "bfloat16", "float16"):
            raise ValueError(f"SavePretrained.dtype must be float32, bfloat16, float16 or null, got {dtype!r}")
        self.dirpath = Path(dirpath) if dirpath is not None else None
        self.every_n_steps, self.keep_last, self.merge_lora, self.dtype = every_n_steps, keep_last, merge_lora, dtype
        self._saved_step = -1

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Refuse, before training, a ``dirpath`` that holds something other than a saved model (it is
        replaced whole), and ``merge_lora: false`` without LoRA."""
        if not self.merge_lora and pl_module.lora is None:
            raise ValueError("SavePretrained.merge_lora=false saves a LoRA adapter, but model.policy.lora is not set")
        path = self.dirpath
        if (
            path is not None
            and path.exists()
            and (not path.is_dir() or (any(path.iterdir()) and not _is_model_folder(path)))
        ):
            raise ValueError(
                f"SavePretrained.dirpath {str(path)!r} exists and is not a saved model directory (no config.json); "
                "it would be replaced whole: choose another directory (not the logger's)"
            )

    def folder(self, trainer: L.Trainer) -> Path:
        """Where the latest save goes."""
        if self.dirpath is not None:
            return self.dirpath
        return Path(trainer.log_dir or trainer.default_root_dir) / "model"

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if self.every_n_steps and step > 0 and step % self.every_n_steps == 0 and step != self._saved_step:
            self.save(trainer, pl_module)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_step != self._saved_step:
            self.save(trainer, pl_module)

    def save(self, trainer: L.Trainer, pl_module: L.LightningModule) -> Path:
        """Write the policy now (every rank calls this: under FSDP2 the weights are gathered)."""
        from ..models.export import write_model_folder
        from ..models.weights import gathered_weights_for_engine

        out, step = self.folder(trainer), trainer.global_step
        tokenizer = trainer.datamodule.tokenizer if isinstance(trainer.datamodule, PromptDataModule) else None
        with gathered_weights_for_engine(pl_module.policy) as weights:
            if trainer.is_global_zero:
                self._shift_previous(out)
                write_model_folder(
                    pl_module.policy,
                    tokenizer,
                    out,
                    dtype=self.dtype,
                    adapter=not self.merge_lora,
                    weights=None if not self.merge_lora else weights,
                    base_model=pl_module.model_source,
                    carry_base=False,  # a copy of the base at every save: `lightning-grpo export --adapter` carries it
                )
                (out / STEP_FILE).write_text(json.dumps({"global_step": step}) + "\n")
        self._saved_step = step
        return out

    def _shift_previous(self, out: Path) -> None:
        """Keep the save now in ``out`` as ``<out>-step<N>`` (``keep_last`` > 1), drop saves beyond it."""
        if self.keep_last > 1 and (out / STEP_FILE).is_file():
            previous = json.loads((out / STEP_FILE).read_text())["global_step"]
            kept = out.with_name(f"{out.name}-step{previous}")
            shutil.rmtree(kept, ignore_errors=True)
            out.rename(kept)
        pattern = re.compile(rf"^{re.escape(out.name)}-step(\d+)$")
        older = sorted(
            (p for p in out.parent.glob(f"{out.name}-step*") if pattern.match(p.name)),
            key=lambda p: int(pattern.match(p.name).group(1)),
        )
        for stale in older[: max(0, len(older) - (self.keep_last - 1))]:
            shutil.rmtree(stale, ignore_errors=True)

    @override
    def state_dict(self) -> dict[str, int]:
        return {"saved_step": self._saved_step}

    @override
    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        self._saved_step = int(state_dict.get("saved_step", -1))


def _is_model_folder(path: Path) -> bool:
    return (path / "config.json").exists() or (path / "adapter_config.json").exists()
