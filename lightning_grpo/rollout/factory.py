"""Build a rollout engine by name for a GRPOModule (the engines registry)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from ..core.registry import Registry
from .base import RolloutEngine

ENGINES: Registry = Registry("rollout engine")


@ENGINES.register("hf")
def _hf_engine(module, tokenizer, seed: int, args: dict[str, Any]) -> RolloutEngine:
    from .hf import HFEngine

    if args:
        raise ValueError(
            f"engine 'hf' takes no engine arguments (rollout.vllm_args are for engine 'vllm'), got {sorted(args)}"
        )
    return HFEngine(module.policy, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)


@ENGINES.register("vllm")
def _vllm_engine(module, tokenizer, seed: int, args: dict[str, Any]) -> RolloutEngine:
    """vLLM loads the architecture from a checkpoint directory: the module's model path when it
    has one, otherwise the live policy saved to a temporary directory. The current weights are
    pushed right after (the callback does it before the first generation)."""
    from .vllm import VLLMEngine

    return VLLMEngine(_model_dir(module, tokenizer), seed=seed, **args)


@ENGINES.register("vllm_server")
def _vllm_server_engine(module, tokenizer, seed: int, args: dict[str, Any]) -> RolloutEngine:
    """vLLM servers (``rollout/vllm_server.py``): the user's (``urls``) or started on the model directory."""
    from .vllm_server import ServerSettings, build_server_engine

    settings = ServerSettings.from_args(args)
    trainer = module._trainer
    rank = trainer.global_rank if trainer is not None else 0
    log_dir = (trainer.log_dir if trainer is not None else None) or tempfile.mkdtemp(prefix="lightning-grpo-servers-")
    model_dir = _model_dir(module, tokenizer) if settings.urls is None else None
    if trainer is not None and trainer.world_size > 1:
        return build_server_engine(settings, model_dir, rank, log_dir, lambda obj: trainer.strategy.broadcast(obj, src=0))
    return build_server_engine(settings, model_dir, rank, log_dir)


def _model_dir(module, tokenizer) -> str:
    """A checkpoint directory vLLM can load: the module's model path when it has one, otherwise
    the live policy saved to a temporary directory (the built-in tiny model without a policy)."""
    path = module.model_source
    from ..models.hub import is_local_path

    if path is not None and not is_local_path(path):  # a hub id: vLLM needs the files on disk
        path = _download(path)
    elif path is None and module.policy is not None:
        path = _save_for_engine(module.policy, tokenizer)
    elif path is None:
        from ..models.tiny import DEFAULT_BUILTIN, builtin_model_path

        path = builtin_model_path(DEFAULT_BUILTIN)  # the built-in tiny model of the run's seed
    return str(path)


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


def build_engine(name: str, module, tokenizer, seed: int, args: dict[str, Any] | None = None) -> RolloutEngine:
    """The engine called ``name`` ("vllm", "vllm_server" or "hf") for ``module``'s policy."""
    return ENGINES.get(name)(module, tokenizer, seed, dict(args or {}))
