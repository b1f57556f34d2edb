"""A checkpoint folder the vLLM engines load: the policy's model folder, a hub id's snapshot, or the live
policy saved to a temporary folder."""

from __future__ import annotations

import tempfile
from pathlib import Path


def engine_model_dir(module, tokenizer) -> tuple[str, bool]:
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
            f"rollout.engine: model.model {repo_id!r} is not a local directory and could not be fetched from the "
            f"Hugging Face hub ({type(err).__name__}: {err}); pass a local model directory"
        ) from err


def _save_for_engine(policy, tokenizer) -> str:
    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    if not hasattr(base, "save_pretrained"):
        raise TypeError(
            "a vLLM engine needs a Hugging Face model (with save_pretrained) or a model path; "
            f"got {type(base).__name__}: use rollout.engine: hf or pass GRPOModule(model='path/to/model')"
        )
    directory = Path(tempfile.mkdtemp(prefix="lightning-grpo-engine-"))
    from ..models.export import save_dense
    from ..models.weights import gathered_weights_for_engine

    # HF checkpoint names (LoRA merged, a 4-bit base dequantised; full under FSDP2), one directory per rank
    with gathered_weights_for_engine(policy) as pairs:
        save_dense(policy, directory, weights=pairs)
    tokenizer.save_pretrained(directory)
    return str(directory)
