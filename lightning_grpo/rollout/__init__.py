"""Rollout engines: sample G completions per prompt with their log-probs (transformers or vLLM)."""

from lightning_grpo.models.weights import gathered_weights_for_engine, policy_weights_for_engine
from lightning_grpo.rollout.base import (
    Rollout,
    RolloutEngine,
    RolloutTensors,
    SamplingConfig,
    derive_seed,
    rollout_to_tensors,
)
from lightning_grpo.rollout.hf import HFEngine
from lightning_grpo.rollout.vllm import VLLMEngine
from lightning_grpo.rollout.vllm_args import VLLMArgs

__all__ = [
    "HFEngine",
    "Rollout",
    "RolloutEngine",
    "RolloutTensors",
    "SamplingConfig",
    "VLLMArgs",
    "VLLMEngine",
    "derive_seed",
    "gathered_weights_for_engine",
    "policy_weights_for_engine",
    "rollout_to_tensors",
]
