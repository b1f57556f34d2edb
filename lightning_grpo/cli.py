"""``lightning-grpo`` / ``python -m lightning_grpo``: LightningCLI over GRPOModule and PromptDataModule.

    lightning-grpo fit -c recipes/quickstart.yaml
    lightning-grpo fit -c recipes/grpo.yaml --trainer.max_steps 50
    lightning-grpo fit --print_config            # every option with its default
"""

from __future__ import annotations

import os
import sys

from lightning.pytorch.cli import LightningCLI


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
        args=args,
        run=run,
        auto_configure_optimizers=False,
    )


def main(args: list[str] | None = None) -> None:
    build_cli(args)


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
