"""The LightningCLI of lightning-grpo: GRPOModule (``model``), PromptDataModule (``data``), the
Trainer (``trainer``, whose ``callbacks`` hold the guards) and the rollout callback in a section of
its own (``rollout``, added with ``add_lightning_class_args`` as Lightning adds ModelCheckpoint):

    lightning-grpo fit -c recipes/quickstart.yaml --rollout.engine hf --rollout.sampling.n 16
    lightning-grpo fit --print_config > my.yaml      # every option with its default: a runnable recipe
    lightning-grpo validate -c recipes/quickstart.yaml --ckpt_path runs/quickstart/version_0/checkpoints/last.ckpt
    lightning-grpo test -c recipes/quickstart.yaml --ckpt_path runs/quickstart/version_0/checkpoints/last.ckpt   # test/* (docs/evidence/tuning.md)

``rollout`` takes a ``class_path`` (``lightning_grpo.AgentRolloutCallback`` for episodes), or its
options alone for the default ``lightning_grpo.RolloutCallback``. A configuration error is printed
as one line (:mod:`lightning_grpo.cli.errors`), and the run plan's checks run before anything is written.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from jsonargparse.typing import PositiveFloat
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_info

from ..callbacks.distributed import DEFAULT_TIMEOUT_S, RankWatch, set_collective_timeout, warn_if_oversubscribed
from .commands import DESCRIPTION, EPILOG, OTHER_COMMANDS, PROG, SUBCOMMAND_HELP
from .errors import condense, mark, print_and_exit
from .help_layout import (
    ROLLOUT_DEFAULT,
    ROLLOUT_KEY,
    lightnings,
    ours_first,
    plain_model_option,
    rollout_options_help,
    short_class_lists,
)
from .quiet import quiet_dirpath_change
from .run_failure import explained, record_failure


def _debug_mode() -> bool:
    """jsonargparse's documented switch for full error output (``JSONARGPARSE_DEBUG``)."""
    return bool(os.environ.get("JSONARGPARSE_DEBUG"))


class GRPOArgumentParser(LightningArgumentParser):
    """LightningArgumentParser that prints a parse error as one line (no usage, no value dump) and
    lists the default rollout class's options in ``--help``."""

    def error(self, message: str, ex: Exception | None = None):  # type: ignore[override]
        if not self.exit_on_error or _debug_mode():
            return super().error(message, ex)
        self._logger.error(message)
        # jsonargparse / argparse internals (third-party)
        print_and_exit(condense(message, getattr(ex, "subcommand_parser", None) or self))

    def format_help(self) -> str:
        """The help, with the default rollout class's options after the package's groups, before Lightning's."""
        text = super().format_help()
        if ROLLOUT_KEY not in getattr(self, "callback_keys", []):  # jsonargparse / argparse internals (third-party)
            return text
        rollout = rollout_options_help()
        first = next((g.title for g in self._action_groups if lightnings(g) and g.title), None)
        at = text.find(f"\n{first}:") if first else -1
        return f"{text[:at]}\n\n{rollout}{text[at:]}" if at >= 0 else f"{text}\n{rollout}"


def check_config_files(args: list[str]) -> None:
    """Read every ``-c`` / ``--config`` file of ``args`` as YAML first: a file that does not parse is one
    error line naming the file, line and column (jsonargparse would name ``<unicode string>``)."""
    import yaml

    paths = [args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-c", "--config")]
    paths += [a.split("=", 1)[1] for a in args if a.startswith(("--config=", "-c="))]
    for path in paths:
        if not os.path.isfile(path):
            continue  # jsonargparse says it
        with open(path, encoding="utf-8", errors="replace") as f:
            content = f.read()
        try:
            yaml.safe_load(content)
        except yaml.YAMLError as err:
            text = yaml_error(os.path.abspath(path), err, content)
            if text is not None:
                print_and_exit(text)


def yaml_error(path: str, err: BaseException, content: str) -> str | None:
    """``<path>, line L, column C: <the problem>`` for a YAML error with a position, else None."""
    mark = getattr(err, "problem_mark", None)  # jsonargparse / argparse internals (third-party)
    if mark is None:
        return None
    # jsonargparse / argparse internals (third-party)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    lines = content.splitlines()
    line = lines[mark.line] if mark.line < len(lines) else ""
    if line[mark.column : mark.column + 1] == "\t":
        problem += " (a tab: YAML indents with spaces, not tabs)"
    return f"{path}, line {mark.line + 1}, column {mark.column + 1}: {problem}"


#: Per subcommand that resolves ``--ckpt_path last``: (what the checkpoint is for, the log's words, the hint
#: when there is none).
_LAST_CHECKPOINT_WORDS = {
    "fit": ("resume", "resuming from", "drop --ckpt_path to start a fresh run"),
    "validate": ("validate", "validating", "pass the checkpoint's path"),
    "test": ("test", "testing", "pass the checkpoint's path"),
}


#: Lightning's warning on a mid-epoch resume: not for GRPO's data, whose prompts are a function of the seed and
#: the step (:mod:`lightning_grpo.data.datamodule`): the resume is exact.
MID_EPOCH_RESUME_WARNING = r"You're resuming from a checkpoint that ended before the epoch ended"


class GRPOCLI(LightningCLI):
    """LightningCLI with the package's module and data module, and the rollout section. Its subcommands
    are ``fit``, ``validate`` and ``test`` (no ``predict``: the module has no ``predict_step``); the
    top-level ``--help`` lists the package's other commands (:data:`other_commands`) with them."""

    #: Commands listed in the top-level ``--help`` that ``main`` hands to their own parsers.
    other_commands: dict[str, str] = OTHER_COMMANDS

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """LightningCLI's subcommands less ``predict``."""
        return {name: skip for name, skip in LightningCLI.subcommands().items() if name != "predict"}

    def _add_subcommands(self, parser: LightningArgumentParser, **kwargs: Any) -> None:
        """LightningCLI's subcommands, then one entry per :data:`other_commands` (an empty parser that
        only names the command in the help: ``main`` dispatches them before this parser runs)."""
        super()._add_subcommands(parser, **kwargs)
        for choice in parser._subcommands_action._choices_actions:  # Lightning's text is its docstring's first lines
            choice.help = SUBCOMMAND_HELP.get(choice.dest, choice.help)
        for name in SUBCOMMAND_HELP:
            ours_first(parser._subcommands_action._name_parser_map[name])
        for name, help_text in self.other_commands.items():
            entry = self.init_parser(description=f"{help_text}. Options: lightning-grpo {name} --help")
            parser._subcommands_action.add_subcommand(name, entry, help=help_text)

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """Parse ``args`` as LightningCLI does, without its warning about ``args`` given while
        ``sys.argv`` has words: ``main`` hands over ``sys.argv`` less the command (``sft ...``)."""
        self.config = parser.parse_object(args) if isinstance(args, (dict, Namespace)) else parser.parse_args(args)

    #: The command that resumes a run (printed after Ctrl-C).
    fit_command = "lightning-grpo fit"

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        from ..callbacks.rollout import RolloutCallback

        parser.add_lightning_class_args(RolloutCallback, ROLLOUT_KEY, subclass_mode=True, required=False)
        parser.set_defaults({ROLLOUT_KEY: {"class_path": ROLLOUT_DEFAULT}})
        self.add_common_arguments(parser)

    def add_common_arguments(self, parser: LightningArgumentParser) -> None:
        """``--model.model`` as a path, and ``--distributed_timeout`` (also the ``sft`` command's)."""
        plain_model_option(parser)
        short_class_lists(parser)
        parser.add_argument(
            "--distributed_timeout",
            type=PositiveFloat,
            default=DEFAULT_TIMEOUT_S,
            help="Multi-process runs (DDP / FSDP): seconds a collective waits for every rank before the run "
            "stops, naming the rank that stopped answering",
        )

    def _run_subcommand(self, subcommand: str) -> None:
        """Run ``subcommand``; an error leaves ``failed.txt`` in the run folder (rank zero), and one
        whose message names its cause becomes a one-line :class:`~.run_failure.RunFailed`."""
        quiet_dirpath_change(subcommand, self.trainer)
        try:
            super()._run_subcommand(subcommand)
        except Exception as err:
            trainer = self.trainer
            run_dir = trainer.log_dir if trainer.logger is not None and trainer.is_global_zero else None
            told = explained(err, record_failure(run_dir, err, trainer.global_step))
            if told is None:
                raise
            raise told from err

    def instantiate_classes(self) -> None:
        """Build everything and hand the data the policy's tokenizer source; a constructor's error is reported
        with the option it came from."""
        from ..data.datamodule import PromptDataModule
        from ..training.policy import PolicyMixin

        try:
            super().instantiate_classes()
            if isinstance(self.datamodule, PromptDataModule):  # data.tokenizer_path unset: the policy's own
                model = self.model  # a user's LightningModule has no tokenizer source
                self.datamodule.use_policy_tokenizer(model.tokenizer_source if isinstance(model, PolicyMixin) else None)
            config = self.config.get(str(self.subcommand), self.config) if self.subcommand else self.config
            set_collective_timeout(self.trainer, config.get("distributed_timeout") or DEFAULT_TIMEOUT_S)
            warn_if_oversubscribed(self.trainer)  # one line, before any process starts
        except (ValueError, TypeError, FileNotFoundError, ImportError) as err:
            config = self.config.get(str(self.subcommand), self.config) if self.subcommand else self.config
            text = str(err)
            if "Given value" in text or "Does not validate" in text:  # jsonargparse's dump around the real error
                raise mark(type(err)(condense(text, config=config))) from None
            mark(err)
            raise

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list) -> Any:
        """The rollout callback runs before the guards (it samples the batch they inspect), as it
        did when recipes listed it first in ``trainer.callbacks``; the progress bar counts steps; a
        :class:`~lightning_grpo.callbacks.distributed.RankWatch` (signals handled) and an
        :class:`~lightning_grpo.callbacks.interrupt.InterruptCheckpoint` (Ctrl-C) unless listed."""
        from lightning.pytorch.callbacks import ProgressBar

        from ..callbacks.interrupt import InterruptCheckpoint
        from ..callbacks.rollout import RolloutCallback

        callbacks = [c for c in callbacks if c is not None]
        listed = config.get("callbacks") or []
        config["callbacks"] = [*callbacks, *(listed if isinstance(listed, list) else [listed])]
        rollouts = [c for c in config["callbacks"] if isinstance(c, RolloutCallback)]
        if len(rollouts) > 1:
            raise ValueError(
                f"{len(rollouts)} rollout callbacks ({', '.join(type(c).__name__ for c in rollouts)}): the rollout "
                "callback has its own section: move it from trainer.callbacks to 'rollout:' (class_path / init_args)"
            )
        if not any(isinstance(c, RankWatch) for c in config["callbacks"]):  # DDP: a lost rank ends every rank
            config["callbacks"].append(RankWatch(handle_signals=True))
        if not any(isinstance(c, InterruptCheckpoint) for c in config["callbacks"]):  # Ctrl-C: saved, resume said
            config["callbacks"].append(InterruptCheckpoint(self.fit_command))
        if config.get("enable_progress_bar", True) is not False and not any(
            isinstance(c, ProgressBar) for c in config["callbacks"]
        ):
            from ..callbacks.progress import StepProgressBar

            config["callbacks"].append(StepProgressBar())  # steps of max_steps, not epochs
        return super()._instantiate_trainer(config, [])

    def before_fit(self) -> None:
        """Load and check the data, then resolve the run plan (:class:`~lightning_grpo.plan.run_plan.RunPlan`, which
        cross-checks the whole run) and hand it to the rollout callback, before ``trainer.fit`` lets the loggers
        create their run directory: a bad option, file or column fails with nothing written. ``--ckpt_path last``
        is resolved first."""
        from ..callbacks.rollout import RolloutCallback
        from ..data.datamodule import PromptDataModule
        from ..plan.run_plan import RunPlan

        self._resolve_last_checkpoint()
        if isinstance(self.datamodule, PromptDataModule):
            warnings.filterwarnings("ignore", message=MID_EPOCH_RESUME_WARNING)
        self._check_model_source()  # the data reads the policy's tokenizer from it
        try:
            datamodule = self.datamodule
            if isinstance(datamodule, PromptDataModule):
                datamodule.setup("fit")
            for callback in self.trainer.callbacks:
                if isinstance(callback, RolloutCallback) and isinstance(datamodule, PromptDataModule):
                    side = callback.plan_side()
                    callback.use_plan(RunPlan.resolve(self.trainer, self.model, datamodule, side, self._recipes()))
        except (ValueError, TypeError, FileNotFoundError, ImportError, ConnectionError) as err:
            mark(err)
            raise

    def before_validate(self) -> None:
        """``--ckpt_path last`` is resolved as ``fit`` resolves it (the run folder's newest checkpoint); the
        model name is checked as ``fit`` checks it."""
        self._resolve_last_checkpoint()
        self._check_model_source()

    def before_test(self) -> None:
        """``--ckpt_path last`` is resolved as ``fit`` resolves it (the run folder's newest checkpoint); the
        model name is checked as ``fit`` checks it."""
        self._resolve_last_checkpoint()
        self._check_model_source()

    def _check_model_source(self) -> None:
        """``model.model`` names a model folder, or a hub id that is cached or reachable: one line, before any
        run folder is made."""
        from ..checks.model_checks import check_model_source

        try:
            check_model_source(self.model)
        except FileNotFoundError as err:
            raise mark(err) from None

    def _recipes(self) -> list[str]:
        """The config files given with ``-c`` (their headers may say how to make what the run needs)."""
        config = self.config.get(str(self.subcommand), self.config) if self.subcommand else self.config
        # jsonargparse / argparse internals (third-party)
        return [str(getattr(p, "absolute", None) or p) for p in (config.get("config") or []) if p is not None]

    def _resolve_last_checkpoint(self) -> None:
        """``ckpt_path: last``: the newest ``version_*/checkpoints/last.ckpt`` (else the newest ``.ckpt``)
        in the logger's run folder (``runs/<name>``), written into the saved config.yaml too.
        Lightning alone looks in the new version's own (empty) folder. None found: an error (Lightning
        would warn and train from scratch, which a resume should not do silently), unless a
        ModelCheckpoint's own ``dirpath`` holds a ``last*.ckpt`` (then Lightning resolves it). ``validate`` /
        ``test`` resolve it the same way (Lightning alone would read the untrained model)."""
        from ..models.export import ExportError, find_checkpoint

        config, config_init = self.config[self.subcommand], self.config_init[self.subcommand]
        if config.get("ckpt_path") != "last":
            return
        logger = self.trainer.logger
        # jsonargparse / argparse internals (third-party)
        root = getattr(logger, "root_dir", None) if logger is not None else None
        root = Path(root if root is not None else self.trainer.default_root_dir)
        try:
            found = str(find_checkpoint(root))
        except ExportError:
            if self._checkpoint_dirpath_has_last():
                return
            verb, _, hint = _LAST_CHECKPOINT_WORDS[str(self.subcommand)]
            raise mark(
                FileNotFoundError(
                    f"--ckpt_path last: no checkpoint to {verb} in {root} (searched version_*/checkpoints/*.ckpt); {hint}"
                )
            ) from None
        config["ckpt_path"] = config_init["ckpt_path"] = found
        rank_zero_info(f"--ckpt_path last: {_LAST_CHECKPOINT_WORDS[str(self.subcommand)][1]} {found}")

    def _checkpoint_dirpath_has_last(self) -> bool:
        from lightning.pytorch.callbacks import ModelCheckpoint

        folders = [
            Path(cb.dirpath)
            for cb in self.trainer.checkpoint_callbacks
            if isinstance(cb, ModelCheckpoint) and cb.dirpath
        ]
        return any(any(folder.glob("last*.ckpt")) for folder in folders if folder.is_dir())


def _shows_help(argv: list[str]) -> bool:
    """True when the command prints the options' help (``-h``, ``--help``, a class's ``--rollout.engine.help``,
    ``--print_config=comments``)."""
    return any(
        a in ("-h", "--help")
        or a.endswith(".help")
        or ".help=" in a
        or (a.startswith("--print_config") and "comments" in a)
        for a in argv
    )


def build_cli(
    args: list[str] | None = None,
    run: bool = True,
    cli_class: type[LightningCLI] = GRPOCLI,
    model_class: type | None = None,
    datamodule_class: type | None = None,
    epilog: str = EPILOG,
    prog: str = PROG,
    description: str = DESCRIPTION,
) -> LightningCLI:
    """The CLI over GRPOModule and PromptDataModule, or ``model_class`` and ``datamodule_class`` (the
    ``sft`` command's; ``run=False``: parse and instantiate only); ``prog`` starts the usage line, ``description`` follows it."""
    from jsonargparse import set_parsing_settings

    from ..data.datamodule import PromptDataModule
    from ..training.module import GRPOModule

    argv = sys.argv[1:] if args is None else list(args)
    # The dataclass fields' docstrings are read (from the source, about 2 s) only where they are shown.
    set_parsing_settings(docstring_parse_attribute_docstrings=_shows_help(argv))
    check_config_files(argv)
    return cli_class(
        model_class or GRPOModule,
        datamodule_class or PromptDataModule,
        subclass_mode_model=False,
        subclass_mode_data=False,
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"epilog": epilog, "prog": prog, "description": description},
        parser_class=GRPOArgumentParser,
        args=args,
        run=run,
        auto_configure_optimizers=False,
    )
