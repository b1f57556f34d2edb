"""Train a shipped recipe for a few steps from the CLI (parse, build, ``trainer.fit``) into a temporary run folder."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bad_input_helpers import cli

ROOT = Path(__file__).resolve().parents[1]


def train_recipe(tmp_path: Path, recipe: str, steps: int, engine=None, extra: list[str] = ()):
    """Train ``recipe`` for ``steps`` steps into ``tmp_path/runs/run`` (validation at the last step);
    returns (the CLI, the version folder)."""
    from lightning_grpo import RolloutCallback

    logger = {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(tmp_path / "runs"), "name": "run"}}
    args = ["-c", str(ROOT / "recipes" / recipe), f"--trainer.max_steps={steps}", f"--trainer.val_check_interval={steps}",
            "--trainer.log_every_n_steps=1", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
            f"--trainer.logger={json.dumps(logger)}", "--data.val_batch_size=50", *extra]  # fmt: skip
    if engine is None:
        args += ["--rollout.engine=hf", "--rollout.vllm_args=null"]
    built = cli(args, run=False)
    (callback,) = [c for c in built.trainer.callbacks if isinstance(c, RolloutCallback)]
    if engine is not None:
        callback.use_engine(engine)
    built.trainer.fit(built.model, datamodule=built.datamodule)
    return built, Path(built.trainer.log_dir)
