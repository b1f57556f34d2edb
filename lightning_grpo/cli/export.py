"""``lightning-grpo export CHECKPOINT_OR_RUN_DIR --out DIR``: a trained policy as a Hugging Face model
folder (:mod:`lightning_grpo.models.export`).

    lightning-grpo export runs/quickstart --out my-model                     # latest run, last.ckpt
    lightning-grpo export runs/grpo_lora/version_0 --out my-adapter --adapter  # the LoRA adapter alone
    lightning-grpo export path/to/last.ckpt --out my-model --dtype bfloat16 --force
"""

from __future__ import annotations

import argparse
import sys

from .errors import print_and_exit


def main(argv: list[str] | None = None) -> int:
    """Parse, export, print what was written; bad input exits with status 2 and one line."""
    parser = argparse.ArgumentParser(
        prog="lightning-grpo export",
        description="Write a trained policy as a Hugging Face model folder (AutoModelForCausalLM, vllm.LLM).",
    )
    parser.add_argument(
        "source",
        help="a checkpoint (.ckpt file or FSDP2 checkpoint folder), a run's version_N folder, "
        "or a run folder (its latest version with a checkpoint; last.ckpt first)",
    )
    parser.add_argument("--out", required=True, help="the folder to write (must be new or empty, unless --force)")
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        default=None,
        help="cast the weights (default: as trained)",
    )
    parser.add_argument(
        "--adapter", action="store_true", help="LoRA runs: the adapter alone, in peft's format (default: merged)"
    )
    parser.add_argument("--force", action="store_true", help="replace a non-empty --out folder")
    args = parser.parse_args(argv)
    from ..models.export import ExportError, check_output, export, iter_saved_names, locate_checkpoint

    try:
        check_output(args.out, args.force)
        checkpoint, skipped = locate_checkpoint(args.source)
        if skipped:
            print(
                f"note: skipped {', '.join(map(str, skipped))}: no checkpoint (a run that failed or stopped before "
                f"its first save); using the newest version that has one"
            )
        out = export(checkpoint, args.out, dtype=args.dtype, adapter=args.adapter, force=args.force)
    except ExportError as err:
        print_and_exit(str(err), prog="lightning-grpo export")
    tensors = sum(1 for _ in iter_saved_names(out))
    files = ", ".join(sorted(p.name for p in out.iterdir()))
    what = "the LoRA adapter" if args.adapter else "the policy"
    print(f"exported {what} ({tensors} tensors) from {checkpoint} to {out}: {files}")
    if args.adapter and _modules_to_save(out):
        print(
            f"note: the adapter also holds whole modules ({', '.join(_modules_to_save(out))}, peft modules_to_save): peft "
            "loads it, vLLM does not serve such an adapter; serve the merged export (without --adapter) instead"
        )
    sys.stdout.flush()
    return 0


def _modules_to_save(folder) -> list[str]:
    import json

    return list(json.loads((folder / "adapter_config.json").read_text()).get("modules_to_save") or [])
