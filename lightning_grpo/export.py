"""A trained policy as a Hugging Face model folder (``lightning-grpo export``, :class:`SavePretrained`).

The folder loads with ``transformers.AutoModelForCausalLM.from_pretrained`` /
``AutoTokenizer.from_pretrained`` and with ``vllm.LLM``: ``model.safetensors``, ``config.json``
(its ``dtype`` the exported one), ``generation_config.json`` and the run's tokenizer with its chat
template. A LoRA policy is exported merged (``W + alpha / r * B A``, a plain model) or, with
``adapter=True``, as its adapter alone in peft's format (``adapter_config.json``,
``adapter_model.safetensors``; ``modules_to_save`` included) next to the tokenizer.

Checkpoints are self-describing: ``GRPOModule.on_save_checkpoint`` stores :func:`export_info`
(the policy's config and generation config, the tokenizer's files, the LoRA settings) under
``lightning_grpo_export``, so export needs neither the recipe nor the original model folder. It
reads a Lightning ``.ckpt`` file (one device, DDP), a distributed checkpoint folder (FSDP2 through
``ModelParallelStrategy``), a run's version folder (``version_N/checkpoints/last.ckpt``) or a run
folder (its latest version with a checkpoint). Every input is checked before anything is written;
the folder is written next to its final place and renamed into it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch
from torch import nn

EXPORT_KEY = "lightning_grpo_export"
DTYPES = ("float32", "bfloat16", "float16")


class ExportError(ValueError):
    """A source that holds no exportable policy, or an output folder that may not be written."""


# ------------------------------------------------------------------------ stored in checkpoints
def export_info(module: Any, tokenizer: Any) -> dict[str, Any]:
    """What export needs besides the weights: the policy's HF config and generation config, the
    tokenizer's files (bytes; the chat template included), the LoRA settings and the model source."""
    policy = module.policy
    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    info: dict[str, Any] = {"model_source": getattr(module, "model_source", None), "lora": None, "tokenizer_files": {}}
    if getattr(module, "lora", None) is not None:
        info["lora"] = asdict(module.lora)
    if hasattr(base, "config") and hasattr(base.config, "to_dict"):
        info["config"] = base.config.to_dict()
    generation = getattr(base, "generation_config", None)
    if generation is not None and hasattr(generation, "to_dict"):
        info["generation_config"] = generation.to_dict()
    if tokenizer is not None:
        with tempfile.TemporaryDirectory(prefix="lightning-grpo-tokenizer-") as folder:
            tokenizer.save_pretrained(folder)
            info["tokenizer_files"] = {p.name: p.read_bytes() for p in Path(folder).iterdir() if p.is_file()}
    return info


# --------------------------------------------------------------------------- finding the source
def find_checkpoint(source: str | Path) -> Path:
    """The checkpoint ``source`` names: a ``.ckpt`` file, a distributed checkpoint folder, a version
    folder's ``checkpoints/last.ckpt`` (else its newest ``.ckpt``), or a run folder's latest version
    that kept one (:func:`locate_checkpoint` also names the newer versions it skipped)."""
    return locate_checkpoint(source)[0]


def locate_checkpoint(source: str | Path) -> tuple[Path, list[Path]]:
    """(:func:`find_checkpoint`, the newer version folders of a run folder that hold no checkpoint:
    runs that failed or stopped before their first save, newest first)."""
    path = Path(source)
    if not path.exists():
        raise ExportError(f"{path}: no such file or folder (expected a checkpoint or a run directory)")
    if path.is_file() or _is_distributed_checkpoint(path):
        if path.is_file() and not _is_torch_file(path):
            raise ExportError(f"{path} is not a Lightning checkpoint (expected a .ckpt file written by Trainer / ModelCheckpoint)")
        return path, []
    versions = [path] if (path / "checkpoints").is_dir() else sorted(
        path.glob("version_*"), key=lambda p: int(re.sub(r"\D", "", p.name) or -1), reverse=True)  # fmt: skip
    for i, version in enumerate(versions):
        found = _checkpoint_in(version / "checkpoints")
        if found is not None:
            return found, versions[:i]
    if versions or (path / "metrics.csv").is_file():
        raise ExportError(
            f"run directory {path} holds no checkpoint (no checkpoints/*.ckpt): the run kept none. Recipes keep "
            "last.ckpt with a ModelCheckpoint(save_last: true) in trainer.callbacks; or save the model during "
            "training with the SavePretrained callback"
        )
    raise ExportError(f"{path} is neither a Lightning checkpoint nor a run directory (no version_*/checkpoints, no checkpoints/)")


def _checkpoint_in(folder: Path) -> Path | None:
    if not folder.is_dir():
        return None
    if (folder / "last.ckpt").exists():
        return folder / "last.ckpt"
    found = sorted(folder.glob("*.ckpt"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def _is_distributed_checkpoint(path: Path) -> bool:
    return path.is_dir() and (path / ".metadata").is_file()


def _is_torch_file(path: Path) -> bool:
    with open(path, "rb") as f:
        head = f.read(4)
    return head.startswith(b"PK") or head[:1] == b"\x80"  # a zip (torch.save) or a legacy pickle


# ---------------------------------------------------------------------------- reading the source
def load_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any]]:
    """(the policy's state dict without its ``policy.`` prefix, the export info, the module's hparams)."""
    if path.is_dir():
        meta = _safe_load(path / "meta.pt")
        state = _load_distributed_state(path)
    else:
        meta = _safe_load(path)
        state = meta.get("state_dict") if isinstance(meta, dict) else None
    if not isinstance(meta, dict) or not isinstance(state, dict):
        raise ExportError(f"{path} is not a Lightning checkpoint (no state_dict)")
    policy = {k[len("policy.") :]: v for k, v in state.items() if k.startswith("policy.")}
    if not policy:
        raise ExportError(f"{path} holds no policy weights (no 'policy.*' in its state_dict): not a GRPOModule checkpoint")
    info = meta.get(EXPORT_KEY)
    if not isinstance(info, dict) or "config" not in info:
        raise ExportError(
            f"{path} was written before checkpoints carried their export information ({EXPORT_KEY}); "
            "resume it for one step (--ckpt_path) to write a new checkpoint, then export that"
        )
    return policy, info, dict(meta.get("hyper_parameters") or {})


def _safe_globals() -> list[Any]:
    """The classes a GRPOModule checkpoint legitimately pickles besides tensors and builtins: its
    settings dataclasses (Python API hyper_parameters), paths, and transformers' quantisation enum
    (in the stored config of QLoRA checkpoints written before the settings were kept apart)."""
    import pathlib

    from .lora import LoraSettings
    from .quantization import QuantizationSettings

    allowed: list[Any] = [LoraSettings, QuantizationSettings, pathlib.PosixPath, pathlib.PurePosixPath,
                          pathlib.WindowsPath, pathlib.PureWindowsPath]  # fmt: skip
    try:
        from transformers.utils.quantization_config import QuantizationMethod

        allowed.append(QuantizationMethod)
    except ImportError:  # pragma: no cover - transformers is a dependency
        pass
    return allowed


def _safe_load(path: Path) -> Any:
    """``torch.load(weights_only=True)``: tensors, containers and the allowed classes only, so loading a
    file never runs code it carries; anything else is refused with the globals it names."""
    import pickle

    from torch.serialization import get_unsafe_globals_in_checkpoint, safe_globals

    allowed = _safe_globals()
    try:
        with safe_globals(allowed):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        known = {f"{c.__module__}.{c.__qualname__}" for c in allowed}
        try:
            refused = [g for g in get_unsafe_globals_in_checkpoint(path) if g not in known]
        except Exception:  # noqa: BLE001 - the message below still names the file
            refused = []
        names = ", ".join(refused) if refused else str(err).splitlines()[0]
        raise ExportError(
            f"{path} holds objects that loading would run code for ({names}); export loads checkpoints with "
            "torch.load(weights_only=True) and refuses such files. A GRPOModule checkpoint holds none: re-save "
            "the run's checkpoint from its training code if you trust where this file came from"
        ) from None


def _load_distributed_state(path: Path) -> dict[str, torch.Tensor]:
    """The full model state of a distributed (DCP) checkpoint folder, read in this process."""
    # as torch's own dcp_to_torch_save reads one: dcp.load keeps only keys already in the given dict
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict[str, Any] = {}
    _load_state_dict(state, storage_reader=FileSystemReader(str(path)), planner=_EmptyStateDictLoadPlanner(keys={"state_dict"}),
                     no_dist=True)  # fmt: skip
    if not isinstance(state.get("state_dict"), dict):
        raise ExportError(f"{path} is a distributed checkpoint without a model state_dict (not written by Lightning)")
    return state["state_dict"]


def build_policy(weights: dict[str, torch.Tensor], info: dict[str, Any]) -> nn.Module:
    """The policy of a checkpoint: its architecture from the stored config (on ``meta``, no
    initialisation), LoRA-wrapped when it was trained with LoRA, its tensors assigned."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config_dict = dict(info["config"])
    config = AutoConfig.for_model(config_dict.pop("model_type"), **config_dict)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    if info.get("lora") is not None:
        from peft import get_peft_model

        from .lora import LoraSettings

        model = get_peft_model(model, LoraSettings(**info["lora"]).to_peft())
    missing, unexpected = model.load_state_dict(weights, strict=False, assign=True)
    missing = [k for k in missing if not k.endswith("lm_head.weight") or not getattr(config, "tie_word_embeddings", False)]
    if missing or unexpected:
        raise ExportError(f"the checkpoint's policy does not match its stored config: missing {missing[:4]}, unexpected {unexpected[:4]}")
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(config, "tie_word_embeddings", False):
        base.tie_weights()
    _materialise_buffers(base)
    return model.eval()


def _materialise_buffers(model: nn.Module) -> None:
    """Non-persistent buffers (rotary ``inv_freq``) are not in a state dict: recompute them on CPU
    from a fresh instance of their module (transformers 5 rotary modules take only the config)."""
    for module in model.modules():
        meta = [name for name, buf in module.named_buffers(recurse=False) if buf.is_meta]
        if not meta or not hasattr(module, "config"):
            continue  # the weights export without them; only a forward on this policy needs them
        with torch.device("cpu"):
            fresh = type(module)(module.config)
        for name in meta:
            module.register_buffer(name, getattr(fresh, name), persistent=False)
        for name, value in vars(fresh).items():  # plain tensor attributes some versions keep (original_inv_freq)
            if isinstance(value, torch.Tensor) and getattr(module, name, None) is not None and getattr(module, name).is_meta:
                setattr(module, name, value)


def tokenizer_from_files(files: dict[str, bytes]) -> Any:
    """The tokenizer saved in a checkpoint's export info."""
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory(prefix="lightning-grpo-tokenizer-") as folder:
        for name, data in files.items():
            (Path(folder) / name).write_bytes(data)
        return AutoTokenizer.from_pretrained(folder)


# ------------------------------------------------------------------------------------- writing
def check_output(out: str | Path, force: bool = False) -> Path:
    """``out`` may be written: absent, empty, or (``force``) a folder that is replaced whole."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ExportError(f"--out {out} is not empty: choose a new folder, or pass --force to replace it")
    return out


def write_model_folder(policy: nn.Module, tokenizer: Any, out: str | Path, *, dtype: str | None = None,
                       adapter: bool = False, weights: Iterable[tuple[str, torch.Tensor]] | None = None,
                       base_model: str | None = None) -> Path:  # fmt: skip
    """Write ``policy`` (and ``tokenizer``) as a model folder at ``out``, replacing it whole.

    ``weights``: the ``(hf_name, tensor)`` pairs to save (default: the policy's, LoRA merged; under
    FSDP2 pass the gathered ones); ``adapter``: the peft adapter alone (needs a peft policy);
    ``base_model``: the adapter's ``base_model_name_or_path``."""
    if dtype is not None and dtype not in DTYPES:
        raise ExportError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    out = Path(out)
    tmp = out.with_name(f".tmp-{out.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        if adapter:
            _write_adapter(policy, tmp, dtype, base_model)
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
    from .rollout.weights import policy_weights_for_engine

    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    if not hasattr(base, "save_pretrained"):
        raise ExportError(f"the policy ({type(base).__name__}) is not a Hugging Face model (no save_pretrained)")
    target = getattr(torch, dtype) if dtype is not None else None
    pairs = policy_weights_for_engine(policy) if weights is None else weights
    state = {name: (t.to(target) if target is not None else t).detach().to("cpu").contiguous() for name, t in pairs}
    used = str(next(iter(state.values())).dtype).removeprefix("torch.")
    base.save_pretrained(folder, state_dict=state, safe_serialization=True)
    _set_config_dtype(folder / "config.json", used)
    if not (folder / "generation_config.json").exists() and getattr(base, "generation_config", None) is not None:
        base.generation_config.save_pretrained(folder)


def _write_adapter(policy: nn.Module, folder: Path, dtype: str | None, base_model: str | None) -> None:
    if not hasattr(policy, "peft_config"):
        raise ExportError("--adapter exports a LoRA adapter, but the policy was trained without model.lora")
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


def _set_config_dtype(file: Path, dtype: str) -> None:
    config = json.loads(file.read_text())
    for key in ("dtype", "torch_dtype"):
        if key in config or key == "dtype":
            config[key] = dtype
    file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


# ------------------------------------------------------------------------------------- export
def export(source: str | Path, out: str | Path, *, dtype: str | None = None, adapter: bool = False,
           force: bool = False) -> Path:  # fmt: skip
    """Export the policy of checkpoint / run directory ``source`` to the model folder ``out``
    (see the module docstring). Raises :class:`ExportError` before writing anything on bad input."""
    out = check_output(out, force)
    if dtype is not None and dtype not in DTYPES:
        raise ExportError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    checkpoint = find_checkpoint(source)
    weights, info, _ = load_checkpoint(checkpoint)
    if adapter and info.get("lora") is None:
        raise ExportError(f"--adapter exports a LoRA adapter, but {checkpoint} was trained without model.lora")
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
