"""Build a rollout engine by name for a GRPOModule (the engines registry)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.registry import Registry
from .base import RolloutEngine
from .vllm_args import VLLMArgs

if TYPE_CHECKING:
    from .vllm_server import ServerSettings

ENGINES: Registry = Registry("rollout engine")


def _same(obj: Any) -> Any:
    return obj


@dataclass(frozen=True)
class EngineContext:
    """Where the engine runs: handed over by the caller (the RolloutCallback reads them from its Trainer)."""

    rank: int = 0
    """This process's global rank."""
    world_size: int = 1
    """Processes in the run."""
    log_dir: str | None = None
    """The run's log directory (started vLLM servers write their logs under it); None = a temporary one."""
    broadcast: Callable[[Any], Any] = _same
    """Rank 0's value on every rank (every rank calls it together); the identity for one process."""


@ENGINES.register("hf")
def _hf_engine(module, tokenizer, seed: int, settings: Any, context: EngineContext) -> RolloutEngine:
    from .hf import HFEngine

    if settings is not None:
        raise ValueError(f"engine 'hf' takes no engine settings, got {type(settings).__name__}")
    return HFEngine(module.policy, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)


@ENGINES.register("vllm")
def _vllm_engine(module, tokenizer, seed: int, settings: VLLMArgs | None, context: EngineContext) -> RolloutEngine:
    """vLLM loads the architecture from a checkpoint directory: the module's model path when it
    has one, otherwise the live policy saved to a temporary directory, which the engine removes when it is
    closed (or here, when it fails to start). The current weights are pushed right after (the callback
    does it before the first generation)."""
    from .vllm import VLLMEngine

    path, temporary = _model_dir(module, tokenizer)
    try:
        return VLLMEngine(path, settings, seed=seed, owns_model_dir=temporary)
    except BaseException:
        if temporary:
            shutil.rmtree(path, ignore_errors=True)
        raise


@ENGINES.register("vllm_server")
def _vllm_server_engine(
    module, tokenizer, seed: int, settings: ServerSettings | None, context: EngineContext
) -> RolloutEngine:
    """vLLM servers (``rollout/vllm_server.py``): the user's (``urls``) or started on the model directory (a
    temporary copy of an in-memory policy is removed when the engine is closed or fails to start)."""
    from .vllm_server import ServerSettings, build_server_engine

    settings = settings if settings is not None else ServerSettings()
    log_dir = context.log_dir or tempfile.mkdtemp(prefix="lightning-grpo-servers-")
    model_dir, temporary = _model_dir(module, tokenizer) if settings.urls is None else (None, False)
    try:
        return build_server_engine(settings, model_dir, context.rank, log_dir, context.broadcast, temporary)
    except BaseException:
        if temporary:
            shutil.rmtree(str(model_dir), ignore_errors=True)
        raise


def _model_dir(module, tokenizer) -> tuple[str, bool]:
    """A checkpoint directory vLLM can load: the module's model path when it has one (a hub id is
    downloaded), otherwise the live policy saved to a temporary directory. Returns (the directory,
    whether it is a temporary copy that whoever uses it removes)."""
    from ..models.hub import is_local_path

    path = module.model_source

    if path is None:  # the policy was given as a built module
        return _save_for_engine(module.policy, tokenizer), True
    if not is_local_path(path):  # a hub id: vLLM needs the files on disk
        path = _download(path)
    return str(path), False


def _download(repo_id: str) -> str:
    """The local snapshot of hub model ``repo_id`` (the HF cache, as ``from_pretrained`` uses it)."""
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.py"])
    except Exception as err:  # offline, unknown repo, gated: say what was tried
        raise FileNotFoundError(
            f"engine='vllm': model.model {repo_id!r} is not a local directory and could not be fetched from the "
            f"Hugging Face hub ({type(err).__name__}: {err}); pass a local model directory"
        ) from err


def _save_for_engine(policy, tokenizer) -> str:
    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    if not hasattr(base, "save_pretrained"):
        raise TypeError(
            "engine='vllm' needs a Hugging Face model (with save_pretrained) or a model path; "
            f"got {type(base).__name__}: use engine='hf' or pass GRPOModule(model='path/to/model')"
        )
    directory = Path(tempfile.mkdtemp(prefix="lightning-grpo-engine-"))
    from ..models.export import save_dense
    from ..models.weights import gathered_weights_for_engine

    # HF checkpoint names (LoRA merged, a 4-bit base dequantised; full under FSDP2), one directory per rank
    with gathered_weights_for_engine(policy) as pairs:
        save_dense(policy, directory, weights=pairs)
    tokenizer.save_pretrained(directory)
    return str(directory)


def build_engine(
    name: str,
    module,
    tokenizer,
    seed: int,
    settings: VLLMArgs | ServerSettings | None = None,
    context: EngineContext = EngineContext(),
) -> RolloutEngine:
    """The engine called ``name`` ("vllm", "vllm_server" or "hf") for ``module``'s policy, with its settings
    (:class:`~lightning_grpo.rollout.vllm_args.VLLMArgs`, :class:`~lightning_grpo.rollout.vllm_server.ServerSettings`
    or None for "hf")."""
    return ENGINES.get(name)(module, tokenizer, seed, settings, context)
