"""``lightning-grpo sft``: supervised fine-tuning, the warm start before GRPO (docs/guide/sft.md).

A second LightningCLI over :class:`~lightning_grpo.training.sft.SFTModule` (``model``) and
:class:`~lightning_grpo.data.sft.SFTDataModule` (``data``), with GRPO's parser (one-line errors),
``--ckpt_path last`` and data checks before the run folder is written, and no ``rollout`` section:

    lightning-grpo sft fit -c recipes/sft_quickstart.yaml
    lightning-grpo export runs/sft_quickstart --out runs/sft_quickstart_model
    lightning-grpo fit -c recipes/quickstart.yaml --model.model runs/sft_quickstart_model
"""

from __future__ import annotations

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from .app import GRPOCLI, build_cli

EPILOG = (
    "Then: lightning-grpo export RUN_DIR --out DIR, and a GRPO recipe with --model.model DIR "
    "(lightning-grpo fit -c recipes/quickstart.yaml --model.model DIR)."
)
DESCRIPTION = "Supervised fine-tuning, the warm start before GRPO."


class SFTCLI(GRPOCLI):
    """GRPOCLI without the rollout section and the other commands, over SFTModule and SFTDataModule."""

    other_commands: dict[str, str] = {}

    fit_command = "lightning-grpo sft fit"

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        self.add_common_arguments(parser)


def build_sft_cli(
    args: list[str] | None = None, run: bool = True, cli_class: type[LightningCLI] = SFTCLI
) -> LightningCLI:
    """The ``sft`` command's CLI (``run=False``: parse and instantiate only)."""
    from ..data.sft import SFTDataModule
    from ..training.sft import SFTModule

    return build_cli(args, run, cli_class, SFTModule, SFTDataModule, EPILOG, "lightning-grpo sft", DESCRIPTION)
