"""Reading a checkpoint for ``lightning-grpo export`` (:mod:`lightning_grpo.models.export`): find it in a run
folder, load it without running code it may carry (``torch.load(weights_only=True)`` and an
allow-list), and rebuild the trained policy (LoRA-wrapped; a QLoRA base in its 4-bit layout)."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

EXPORT_KEY = "lightning_grpo_export"


class ExportError(ValueError):
    """A source that holds no exportable policy, or an output folder that may not be written."""


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
    if path.is_file() or is_distributed_checkpoint(path):
        if path.is_file() and not _is_torch_file(path):
            raise ExportError(
                f"{path} is not a Lightning checkpoint (expected a .ckpt file written by Trainer / ModelCheckpoint)"
            )
        return path, []
    versions = (
        [path]
        if (path / "checkpoints").is_dir()
        else sorted(path.glob("version_*"), key=lambda p: int(re.sub(r"\D", "", p.name) or -1), reverse=True)
    )
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
    raise ExportError(
        f"{path} is neither a Lightning checkpoint nor a run directory (no version_*/checkpoints, no checkpoints/)"
    )


def _checkpoint_in(folder: Path) -> Path | None:
    if not folder.is_dir():
        return None
    if (folder / "last.ckpt").exists():
        return folder / "last.ckpt"
    found = sorted(folder.glob("*.ckpt"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def is_distributed_checkpoint(path: Path) -> bool:
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
        raise ExportError(
            f"{path} holds no policy weights (no 'policy.*' in its state_dict): not a GRPOModule checkpoint"
        )
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

    allowed: list[Any] = [
        LoraSettings,
        QuantizationSettings,
        pathlib.PosixPath,
        pathlib.PurePosixPath,
        pathlib.WindowsPath,
        pathlib.PureWindowsPath,
    ]
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
        known = {c[1] if isinstance(c, tuple) else f"{c.__module__}.{c.__qualname__}" for c in allowed}
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
    _load_state_dict(
        state,
        storage_reader=FileSystemReader(str(path)),
        planner=_EmptyStateDictLoadPlanner(keys={"state_dict"}),
        no_dist=True,
    )
    if not isinstance(state.get("state_dict"), dict):
        raise ExportError(f"{path} is a distributed checkpoint without a model state_dict (not written by Lightning)")
    return state["state_dict"]


def build_policy(weights: dict[str, torch.Tensor], info: dict[str, Any]) -> nn.Module:
    """The policy of a checkpoint: its architecture from the stored config (on ``meta``, no
    initialisation), LoRA-wrapped when it was trained with LoRA, its tensors assigned."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config_dict = dict(info["config"])
    quantization = _quantization_of(info, config_dict.pop("quantization_config", None))
    if quantization is not None:  # QLoRA: the 4-bit base as trained, the adapter on top
        from .lora import LoraSettings
        from .quantization import rebuild_quantized

        dtype = info.get("dtype") or str(config_dict.get("dtype") or "float32").removeprefix("torch.")
        try:
            return rebuild_quantized(weights, config_dict, quantization, dtype, LoraSettings(**info["lora"]).to_peft())
        except ValueError as err:
            raise ExportError(str(err)) from None
    config = AutoConfig.for_model(config_dict.pop("model_type"), **config_dict)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    if info.get("lora") is not None:
        from peft import get_peft_model

        from .lora import LoraSettings

        model = get_peft_model(model, LoraSettings(**info["lora"]).to_peft())
    missing, unexpected = model.load_state_dict(weights, strict=False, assign=True)
    missing = [
        # a transformers / peft / bitsandbytes object (third-party)
        k
        for k in missing
        if not k.endswith("lm_head.weight") or not getattr(config, "tie_word_embeddings", False)
    ]
    if missing or unexpected:
        raise ExportError(
            f"the checkpoint's policy does not match its stored config: missing {missing[:4]}, unexpected {unexpected[:4]}"
        )
    # a transformers / peft / bitsandbytes object (third-party)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(config, "tie_word_embeddings", False):  # a transformers / peft / bitsandbytes object (third-party)
        base.tie_weights()
    _materialise_buffers(base)
    return model.eval()


def _quantization_of(info: dict[str, Any], stored: dict[str, Any] | None) -> Any:
    """A QLoRA checkpoint's :class:`~lightning_grpo.models.quantization.QuantizationSettings` (its export info;
    checkpoints written before they were kept there: the stored config's ``quantization_config``)."""
    if info.get("quantization") is None and stored is None:
        return None
    from .quantization import QuantizationSettings, require_bitsandbytes

    require_bitsandbytes()
    if info.get("quantization") is not None:
        return QuantizationSettings(**info["quantization"])
    return QuantizationSettings.from_config(stored)


def _materialise_buffers(model: nn.Module) -> None:
    """Non-persistent buffers (rotary ``inv_freq``) are not in a state dict: recompute them on CPU
    from a fresh instance of their module (transformers 5 rotary modules take only the config)."""
    for module in model.modules():
        meta = [name for name, buf in module.named_buffers(recurse=False) if buf.is_meta]
        if not meta or not hasattr(module, "config"):  # a transformers / peft / bitsandbytes object (third-party)
            continue  # the weights export without them; only a forward on this policy needs them
        with torch.device("cpu"):
            fresh = type(module)(module.config)
        for name in meta:
            module.register_buffer(name, getattr(fresh, name), persistent=False)
        for name, value in vars(fresh).items():  # plain tensor attributes some versions keep (original_inv_freq)
            if (
                isinstance(value, torch.Tensor)
                # a transformers / peft / bitsandbytes object (third-party)
                and getattr(module, name, None) is not None
                and getattr(module, name).is_meta
            ):
                setattr(module, name, value)


def tokenizer_from_files(files: dict[str, bytes]) -> Any:
    """The tokenizer saved in a checkpoint's export info."""
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory(prefix="lightning-grpo-tokenizer-") as folder:
        for name, data in files.items():
            (Path(folder) / name).write_bytes(data)
        return AutoTokenizer.from_pretrained(folder)
