"""``lightning-grpo`` / ``python -m lightning_grpo``: LightningCLI over GRPOModule and PromptDataModule.

    lightning-grpo fit -c recipes/quickstart.yaml
    lightning-grpo fit -c recipes/grpo.yaml --trainer.max_steps 50
    lightning-grpo fit --print_config            # every option with its default
    lightning-grpo report runs/quickstart        # dashboard PNG + summary of a run (report.py)
"""

from __future__ import annotations

import os
import sys

from lightning.pytorch.cli import LightningCLI

REPORT_EPILOG = "also: lightning-grpo report RUN_DIR [--out DIR] [--no-png] (plots and summarises a run's metrics.csv)"


def _prepare_environment() -> None:
    # vLLM in this process (weights pushed as tensors) without its compile step (platform notes).
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def _current_directory_importable() -> None:
    """Put the current directory on ``sys.path`` (once): the ``lightning-grpo`` console script
    starts with its own bin folder there instead, and recipes name reward functions, record maps
    and environments by import path from modules next to them (``my_rewards.fn``)."""
    cwd = os.getcwd()
    if not any(os.path.abspath(entry or ".") == cwd for entry in sys.path):
        sys.path.insert(0, cwd)


class GRPOCLI(LightningCLI):
    """LightningCLI with the package's module and data module as defaults."""

    def before_fit(self) -> None:
        """Load and check the data, then cross-check the whole run (:mod:`lightning_grpo.validation`),
        before ``trainer.fit`` lets the loggers create their run directory: a bad option, file or
        column fails with nothing written."""
        from .callbacks.rollout import RolloutCallback
        from .validation import check_fit_config

        datamodule = self.datamodule
        if datamodule is not None and hasattr(datamodule, "train_records"):
            datamodule.setup("fit")
        for callback in self.trainer.callbacks:
            if isinstance(callback, RolloutCallback):
                check_fit_config(self.trainer, self.model, callback, datamodule)


def build_cli(args: list[str] | None = None, run: bool = True, cli_class: type[LightningCLI] = GRPOCLI) -> LightningCLI:
    """The CLI over GRPOModule and PromptDataModule (``run=False``: parse and instantiate only)."""
    _prepare_environment()
    from .data.datamodule import PromptDataModule
    from .module import GRPOModule

    return cli_class(
        GRPOModule,
        PromptDataModule,
        subclass_mode_model=False,
        subclass_mode_data=False,
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"epilog": REPORT_EPILOG},
        args=args,
        run=run,
        auto_configure_optimizers=False,
    )


def main(args: list[str] | None = None) -> int | None:
    """``lightning-grpo report ...`` goes to :func:`lightning_grpo.report.main` (a failure exits
    with its status); everything else to the LightningCLI (``args`` None: ``sys.argv``)."""
    argv = sys.argv[1:] if args is None else list(args)
    _current_directory_importable()
    if argv[:1] == ["report"]:
        from .report import main as report_main

        status = report_main(argv[1:])
        if status:
            raise SystemExit(status)
        return status
    build_cli(args)
    return None


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
