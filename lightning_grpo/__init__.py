"""lightning-grpo: GRPO-family reinforcement learning for language models, as Lightning plugins.

``import lightning_grpo`` is light: the Lightning pieces load on first use, and the algorithm
core (``lightning_grpo.core``) imports torch only.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0.dev0"

_LAZY = {
    "GRPOModule": "lightning_grpo.training.module",
    "SFTModule": "lightning_grpo.training.sft",
    "AlgorithmSettings": "lightning_grpo.training.settings",
    "KLInRewardSettings": "lightning_grpo.training.settings",
    "PolicySettings": "lightning_grpo.training.settings",
    "ForwardSettings": "lightning_grpo.training.settings",
    "SFTPolicySettings": "lightning_grpo.training.settings",
    "SFTForwardSettings": "lightning_grpo.training.settings",
    "SFTDataModule": "lightning_grpo.data.sft",
    "SFTFormatSettings": "lightning_grpo.data.sft",
    "LoraSettings": "lightning_grpo.models.lora",
    "QuantizationSettings": "lightning_grpo.models.quantization",
    "RolloutCallback": "lightning_grpo.callbacks.rollout",
    "AgentRolloutCallback": "lightning_grpo.agents.callback",
    "AgentSettings": "lightning_grpo.agents.settings",
    "VLLMArgs": "lightning_grpo.rollout.vllm_args",
    "VLLMLora": "lightning_grpo.rollout.vllm_args",
    "VLLMPush": "lightning_grpo.rollout.vllm_args",
    "ServerSettings": "lightning_grpo.rollout.vllm_server",
    "ServerLaunch": "lightning_grpo.rollout.vllm_server",
    "WeightTransfer": "lightning_grpo.rollout.vllm_server",
    "HFSettings": "lightning_grpo.rollout.hf",
    "EngineSettings": "lightning_grpo.rollout.engine_settings",
    "SelectionSettings": "lightning_grpo.callbacks.settings",
    "EvaluationSettings": "lightning_grpo.callbacks.settings",
    "WeightSyncSettings": "lightning_grpo.callbacks.settings",
    "CompletionLogSettings": "lightning_grpo.callbacks.completions",
    "PromptDataModule": "lightning_grpo.data.datamodule",
    "PromptFormat": "lightning_grpo.data.records",
    "DigitTask": "lightning_grpo.data.tasks",
    "Files": "lightning_grpo.data.sources",
    "Rows": "lightning_grpo.data.sources",
    "HubDataset": "lightning_grpo.data.sources",
    "RewardSpec": "lightning_grpo.data.reward_set",
    "SamplingConfig": "lightning_grpo.rollout.base",
    "GRPOLoss": "lightning_grpo.core.objective",
    "KLSettings": "lightning_grpo.core.settings",
    "OffPolicySettings": "lightning_grpo.core.settings",
    "LossTerms": "lightning_grpo.core.settings",
    "NonFiniteGuard": "lightning_grpo.callbacks.guards",
    "LogProbGuard": "lightning_grpo.callbacks.guards",
    "EntropyGuard": "lightning_grpo.callbacks.guards",
    "IdenticalSamplesGuard": "lightning_grpo.callbacks.signal_guards",
    "MismatchGuard": "lightning_grpo.callbacks.signal_guards",
    "ZeroStdGuard": "lightning_grpo.callbacks.signal_guards",
    "TruncationGuard": "lightning_grpo.callbacks.signal_guards",
    "ZeroRewardGuard": "lightning_grpo.callbacks.zero_reward",
    "RewardHackingGuard": "lightning_grpo.callbacks.drift_guards",
    "LengthGuard": "lightning_grpo.callbacks.drift_guards",
    "RewardDropGuard": "lightning_grpo.callbacks.drift_guards",
    "ReferenceSync": "lightning_grpo.callbacks.reference_sync",
    "EntropyController": "lightning_grpo.callbacks.entropy_control",
    "CurriculumCallback": "lightning_grpo.callbacks.curriculum",
    "SavePretrained": "lightning_grpo.callbacks.save_pretrained",
    "DistillSettings": "lightning_grpo.training.distill",
}

__all__ = ["__version__"] + list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lightning_grpo' has no attribute {name!r}")
