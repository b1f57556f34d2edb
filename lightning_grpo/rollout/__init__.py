"""Rollout engines: sample G completions per prompt with their log-probs (transformers or vLLM), and the
settings that choose and build one (``rollout.engine``)."""

from lightning_grpo.models.weights import gathered_weights_for_engine, policy_weights_for_engine
from lightning_grpo.rollout.base import (
    Rollout,
    RolloutEngine,
    RolloutTensors,
    SamplingConfig,
    derive_seed,
    rollout_to_tensors,
)
from lightning_grpo.rollout.engine_settings import EngineContext, EngineSettings, register_engine
from lightning_grpo.rollout.factory import resolve_engine
from lightning_grpo.rollout.hf import HFEngine, HFSettings
from lightning_grpo.rollout.vllm import VLLMEngine
from lightning_grpo.rollout.vllm_args import VLLMArgs
from lightning_grpo.rollout.vllm_server import ServerSettings

__all__ = [
    "EngineContext",
    "EngineSettings",
    "HFEngine",
    "HFSettings",
    "Rollout",
    "RolloutEngine",
    "RolloutTensors",
    "SamplingConfig",
    "ServerSettings",
    "VLLMArgs",
    "VLLMEngine",
    "derive_seed",
    "gathered_weights_for_engine",
    "policy_weights_for_engine",
    "register_engine",
    "resolve_engine",
    "rollout_to_tensors",
]
