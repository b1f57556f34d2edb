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


class GRPOCLI(LightningCLI):
    """LightningCLI with the package's module and data module as defaults."""


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
