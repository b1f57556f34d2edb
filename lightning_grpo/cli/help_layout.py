"""How the command line's help reads: the rollout class's options (listed in ``fit --help``), ``--model.model`` as a
path, the optimizer's and scheduler's common classes, and a subcommand's groups with ours first."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.cli import LightningArgumentParser

#: The rollout section of the command line and its default class.
ROLLOUT_KEY = "rollout"
ROLLOUT_DEFAULT = "lightning_grpo.RolloutCallback"


def rollout_options_help() -> str:
    """The ``--rollout.*`` options of RolloutCallback, as ``--rollout.help RolloutCallback`` prints them."""
    from ..callbacks.rollout import RolloutCallback

    parser = LightningArgumentParser(prog="", usage="")
    parser.add_class_arguments(RolloutCallback, ROLLOUT_KEY, fail_untyped=False, sub_configs=True)
    text = parser.format_help()
    start = text.find("\n\n")
    options = text[start:].strip("\n") if start >= 0 else text
    return f"Rollout options (--rollout.*, class {ROLLOUT_DEFAULT}):\n{options.split(chr(10), 1)[1]}\n"


def plain_model_option(parser: LightningArgumentParser) -> None:
    """``--model.model`` takes a path or hub id on the command line: an ``nn.Module`` can only be given
    from Python, so the option is not parsed as (and its help does not list) every torch module."""
    for action in list(parser._actions):
        if action.dest == "model.model":
            action._typehint = str | None
            action.help = (action.help or "").split("(type:")[0].strip()
        elif action.dest == "model.model.help":
            parser._remove_action(action)
            for group in parser._action_groups:
                if action in group._group_actions:
                    group._group_actions.remove(action)
            for option in action.option_strings:
                parser._option_string_actions.pop(option, None)


#: The classes ``--help`` names for the optimizer and the scheduler (jsonargparse lists every subclass it finds).
COMMON_CLASSES = {
    "model.optimizer": "torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD, or any class path",
    "model.lr_scheduler": "torch.optim.lr_scheduler.LambdaLR, CosineAnnealingLR, LinearLR, StepLR, or any class path",
}
#: The usage line of ``fit`` / ``validate`` / ``test --help``: the groups, ours first (their options follow it).
USAGE = "%(prog)s [-c CONFIG] [--print_config] [--model.* ...] [--data.* ...] [--rollout.* ...] [--trainer.* ...]"


def short_class_lists(parser: LightningArgumentParser) -> None:
    """The optimizer's and the scheduler's help name the common classes (:data:`COMMON_CLASSES`)."""
    for action in parser._actions:
        if action.dest in COMMON_CLASSES:
            text = COMMON_CLASSES[action.dest]
            action.extra_help = lambda text=text: f", for example {text}"  # in place of every known subclass


def ours_first(parser: LightningArgumentParser) -> None:
    """A subcommand's ``--help``: a short usage line, then the package's groups (model, data, rollout) before the
    Trainer's and ``--ckpt_path``'s, which LightningCLI adds first."""
    parser.usage = USAGE
    groups = parser._action_groups
    parser._action_groups = [g for g in groups if not lightnings(g)] + [g for g in groups if lightnings(g)]


def lightnings(group: Any) -> bool:
    """Whether an option group of a subcommand is Lightning's: the Trainer's, or ``--ckpt_path``'s."""
    dests = [a.dest for a in group._group_actions]
    return bool(dests) and all(d.split(".")[0] in ("trainer", "ckpt_path", "weights_only") for d in dests)
