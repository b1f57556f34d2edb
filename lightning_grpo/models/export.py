"""A trained policy as a Hugging Face model folder (``lightning-grpo export``, :class:`SavePretrained`).

The folder loads with ``transformers.AutoModelForCausalLM.from_pretrained`` /
``AutoTokenizer.from_pretrained`` and with ``vllm.LLM``: ``model.safetensors``, ``config.json``
(its ``dtype`` the exported one), ``generation_config.json`` and the run's tokenizer with its chat
template. A LoRA policy is exported merged (``W + alpha / r * B A``, a plain model) or, with
``adapter=True``, as its adapter alone in peft's format (``adapter_config.json``,
``adapter_model.safetensors``; ``modules_to_save`` included) next to the tokenizer. The adapter's
``base_model_name_or_path`` names the hub id when the policy came from the hub; a local base (a model
folder, the built-in tiny model) is written into the folder too (``base/``, the weights the adapter was
trained on) and named ``<folder's name>/base``, so the folder works on any machine.

A QLoRA policy (4-bit base) is rebuilt in its 4-bit layout and exported dequantised and merged: a
plain dense folder without ``quantization_config``, written by :func:`save_dense`, the same function
that writes the vLLM engine's copy of a live policy.

Checkpoints are self-describing: ``GRPOModule.on_save_checkpoint`` stores :func:`export_info`
(the policy's config and generation config, the tokenizer's files, the LoRA and quantisation
settings, the load dtype) under ``lightning_grpo_export``, so export needs neither the recipe nor
the original model folder. It reads (:mod:`lightning_grpo.models.checkpoints`, with
``torch.load(weights_only=True)``: a file whose pickle would run code is refused) a Lightning
``.ckpt`` file (one device, DDP), a distributed checkpoint folder (FSDP2 through
``ModelParallelStrategy``), a run's version folder (``version_N/checkpoints/last.ckpt``) or a run
folder (its newest version with a checkpoint; the command names it and the versions it skipped).
Every input is checked before anything is written; the folder is written next to its final place
and renamed into it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from .checkpoints import (  # noqa: F401 - the reading half, re-exported
    EXPORT_KEY,
    ExportError,
    build_policy,
    find_checkpoint,
    load_checkpoint,
    locate_checkpoint,
    tokenizer_from_files,
)
from .hub import is_local_path

DTYPES = ("float32", "bfloat16", "float16")
#: The subfolder of an adapter export that holds its base model when the base is not on the hub.
BASE_FOLDER = "base"


# ------------------------------------------------------------------------ stored in checkpoints
class ExportSource(Protocol):
    """What `export_info` reads of a training module (the policy mixin of GRPOModule and SFTModule)."""

    policy: Any
    model_source: str | None
    lora: Any
    quantization: Any
    policy_settings: Any


def export_info(module: ExportSource, tokenizer: Any) -> dict[str, Any]:
    """What export needs besides the weights: the policy's HF config and generation config, the
    tokenizer's files (bytes; the chat template included), the LoRA settings and the model source."""
    policy = module.policy
    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy  # a peft model's base
    info: dict[str, Any] = {
        "model_source": module.model_source,
        "lora": None,
        "tokenizer_files": {},
        "quantization": None,
        "dtype": module.policy_settings.dtype,
    }
    if module.lora is not None:
        info["lora"] = asdict(module.lora)
    if module.quantization is not None:  # QLoRA: the 4-bit layout is rebuilt from these on export
        info["quantization"] = asdict(module.quantization)
    # a transformers / peft / bitsandbytes object (third-party)
    if hasattr(base, "config") and hasattr(base.config, "to_dict"):
        info["config"] = {k: v for k, v in base.config.to_dict().items() if k != "quantization_config"}
    generation = getattr(base, "generation_config", None)  # a transformers / peft / bitsandbytes object (third-party)
    if generation is not None and hasattr(generation, "to_dict"):
        info["generation_config"] = generation.to_dict()
    if tokenizer is not None:
        with tempfile.TemporaryDirectory(prefix="lightning-grpo-tokenizer-") as folder:
            tokenizer.save_pretrained(folder)
            info["tokenizer_files"] = {p.name: p.read_bytes() for p in Path(folder).iterdir() if p.is_file()}
    return info


# ------------------------------------------------------------------------------------- writing
def check_output(out: str | Path, force: bool = False) -> Path:
    """``out`` may be written: absent, empty, or (``force``) a folder that is replaced whole."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ExportError(f"--out {out} is not empty: choose a new folder, or pass --force to replace it")
    return out


def write_model_folder(
    policy: nn.Module,
    tokenizer: Any,
    out: str | Path,
    *,
    dtype: str | None = None,
    adapter: bool = False,
    weights: Iterable[tuple[str, torch.Tensor]] | None = None,
    base_model: str | None = None,
    carry_base: bool = True,
) -> Path:
    """Write ``policy`` (and ``tokenizer``) as a model folder at ``out``, replacing it whole.

    ``weights``: the ``(hf_name, tensor)`` pairs to save (default: the policy's, LoRA merged; under
    FSDP2 pass the gathered ones); ``adapter``: the peft adapter alone (needs a peft policy);
    ``base_model``: where the policy was loaded from, named by the adapter's ``base_model_name_or_path`` when it
    is a hub id (:func:`hub_id_of`); a local base (a folder, the built-in tiny model) is written too, into
    ``out/base`` (:data:`BASE_FOLDER`), and named ``<out's name>/base``: the folder carries its base.
    ``carry_base``: False names a local base by its path instead (no copy: saves made during training)."""
    if dtype is not None and dtype not in DTYPES:
        raise ExportError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    out = Path(out)
    tmp = out.with_name(f".tmp-{out.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        if adapter:
            hub_id = hub_id_of(base_model)
            carried = hub_id is None and carry_base
            _write_adapter(policy, tmp, dtype, hub_id or (f"{out.name}/{BASE_FOLDER}" if carried else base_model))
            if carried:
                _write_base(policy, tokenizer, tmp / BASE_FOLDER, dtype)
        else:
            _write_merged(policy, tmp, dtype, weights)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        shutil.rmtree(out, ignore_errors=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _write_merged(policy: nn.Module, folder: Path, dtype: str | None, weights: Iterable | None) -> None:
    # a transformers / peft / bitsandbytes object (third-party)
    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    if not hasattr(base, "save_pretrained"):  # a transformers / peft / bitsandbytes object (third-party)
        raise ExportError(f"the policy ({type(base).__name__}) is not a Hugging Face model (no save_pretrained)")
    save_dense(policy, folder, weights=weights, dtype=dtype)


def save_dense(
    policy: nn.Module,
    folder: str | Path,
    *,
    weights: Iterable[tuple[str, torch.Tensor]] | None = None,
    dtype: str | None = None,
) -> None:
    """Save ``policy`` as a plain dense model folder (``model.safetensors``, ``config.json``,
    ``generation_config.json``): LoRA merged, a 4-bit (QLoRA) base dequantised, and the config without
    its ``quantization_config`` (transformers would save the 4-bit layout, vLLM load it as such). The
    one writer of exported folders and of the vLLM engine's copy of the live policy.

    ``weights``: the ``(hf_name, tensor)`` pairs (default :func:`policy_weights_for_engine`; under FSDP2
    the gathered ones); ``dtype``: cast them. Writes on every rank it is called on."""
    import copy

    from transformers import AutoModelForCausalLM

    from .weights import policy_weights_for_engine

    # a transformers / peft / bitsandbytes object (third-party)
    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    target = getattr(torch, dtype) if dtype is not None else None
    pairs = policy_weights_for_engine(policy) if weights is None else weights
    state = {name: (t.to(target) if target is not None else t).detach().to("cpu").contiguous() for name, t in pairs}
    used = str(next(iter(state.values())).dtype).removeprefix("torch.")
    writer = base
    if getattr(base.config, "quantization_config", None) is not None:  # a dense twin (no memory) saves the dense state
        config = copy.deepcopy(base.config)
        del config.quantization_config
        with torch.device("meta"):
            writer = AutoModelForCausalLM.from_config(config)
        writer.generation_config = copy.deepcopy(base.generation_config)
    with _save_on_every_rank(writer):
        writer.save_pretrained(folder, state_dict=state, safe_serialization=True)
    _set_config_dtype(Path(folder) / "config.json", used)
    # a transformers / peft / bitsandbytes object (third-party)
    if not (Path(folder) / "generation_config.json").exists() and getattr(base, "generation_config", None) is not None:
        base.generation_config.save_pretrained(folder)


@contextmanager
def _save_on_every_rank(model: nn.Module) -> Iterator[None]:
    """transformers' ``save_pretrained`` writes nothing on torch.distributed ranks other than 0
    (``should_save_on_this_rank``); lift that: the caller chose the rank that writes."""
    if not hasattr(model, "should_save_on_this_rank"):  # a transformers / peft / bitsandbytes object (third-party)
        yield
        return
    model.should_save_on_this_rank = lambda is_main_process: True
    try:
        yield
    finally:
        del model.should_save_on_this_rank


def _write_adapter(policy: nn.Module, folder: Path, dtype: str | None, base_model: str | None) -> None:
    if not hasattr(policy, "peft_config"):  # a transformers / peft / bitsandbytes object (third-party)
        raise ExportError("--adapter exports a LoRA adapter, but the policy was trained without model.policy.lora")
    policy.save_pretrained(folder, safe_serialization=True)
    config_file = folder / "adapter_config.json"
    config = json.loads(config_file.read_text())
    if base_model is not None:
        config["base_model_name_or_path"] = base_model
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True))
    if dtype is not None:
        from safetensors.torch import load_file, save_file

        file = folder / "adapter_model.safetensors"
        save_file({k: v.to(getattr(torch, dtype)).contiguous() for k, v in load_file(file).items()}, file)


def _write_base(policy: nn.Module, tokenizer: Any, folder: Path, dtype: str | None) -> None:
    """The adapter's base as trained on (the weights without the adapter, the original of each module trained
    in full, ``modules_to_save``; a 4-bit base dequantised) as a model folder."""
    from .weights import policy_weights_for_engine

    base = policy.get_base_model()
    originals = {
        f"{name}.{key}": tensor
        for name, module in base.named_modules()
        # a transformers / peft / bitsandbytes object (third-party)
        if hasattr(module, "original_module") and hasattr(module, "modules_to_save")
        for key, tensor in module.original_module.state_dict().items()
    }
    weights = ((name, originals.get(name, t)) for name, t in policy_weights_for_engine(policy, merge_lora=False))
    save_dense(policy, folder, weights=weights, dtype=dtype)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)


def hub_id_of(source: str | None) -> str | None:
    """The Hugging Face hub id ``source`` names: itself when it is one (:func:`~.hub.is_local_path`), the id of a
    snapshot folder of the hub cache (``.../models--org--name/snapshots/<revision>``); else None (a local folder)."""
    if not isinstance(source, str) or not source:
        return None
    if not is_local_path(source):
        return source
    parts = Path(source).expanduser().resolve().parts
    for i, part in enumerate(parts[:-2]):
        if part.startswith("models--") and parts[i + 1] == "snapshots":
            return part.removeprefix("models--").replace("--", "/")
    return None


def _set_config_dtype(file: Path, dtype: str) -> None:
    config = json.loads(file.read_text())
    for key in ("dtype", "torch_dtype"):
        if key in config or key == "dtype":
            config[key] = dtype
    file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


# ------------------------------------------------------------------------------------- export
def export(
    source: str | Path, out: str | Path, *, dtype: str | None = None, adapter: bool = False, force: bool = False
) -> Path:
    """Export the policy of checkpoint / run directory ``source`` to the model folder ``out``
    (see the module docstring). Raises :class:`ExportError` before writing anything on bad input."""
    out = check_output(out, force)
    if dtype is not None and dtype not in DTYPES:
        raise ExportError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    checkpoint = find_checkpoint(source)
    weights, info, _ = load_checkpoint(checkpoint)
    if adapter and info.get("lora") is None:
        raise ExportError(f"--adapter exports a LoRA adapter, but {checkpoint} was trained without model.policy.lora")
    policy = build_policy(weights, info)
    tokenizer = tokenizer_from_files(info["tokenizer_files"]) if info.get("tokenizer_files") else None
    base_model = info.get("model_source")
    return write_model_folder(policy, tokenizer, out, dtype=dtype, adapter=adapter, base_model=base_model)


def iter_saved_names(folder: str | Path) -> Iterator[str]:
    """The tensor names in a folder's safetensors files (tests, sanity checks)."""
    from safetensors import safe_open

    for file in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(file), "pt") as handle:
            yield from handle.keys()
