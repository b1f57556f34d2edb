"""Keys a recipe used before the settings were grouped (0.1.0), each with the key that replaced it.

The package was never released, so there is no compatibility layer: an old key is refused with one
line naming its replacement (:func:`renamed_key_message`), before anything is built.
"""

from __future__ import annotations

#: old dotted key (as written in a recipe or on the command line) -> the new key, or what to write instead.
RENAMED: dict[str, str] = {}

# ---------------------------------------------------------------- model.* (GRPOModule)
MODULE_RENAMES: dict[str, str] = {
}

# ---------------------------------------------------------------- model.loss.* (GRPOLoss)
LOSS_RENAMES: dict[str, str] = {
}

# ---------------------------------------------------------------- rollout.* (RolloutCallback)
# rollout.weight_sync (a bool) is now the section rollout.weight_sync (enabled, lora): the same key, so it is not
# listed (its fields would be answered as renamed); `rollout.weight_sync: false` -> `rollout.weight_sync.enabled: false`.
ROLLOUT_RENAMES: dict[str, str] = {
    "rollout.vllm_args": "rollout.vllm (engine vllm: typed VLLMArgs fields) or rollout.server (engine vllm_server: "
                         "ServerSettings fields)",
    "rollout.dynamic_sampling": "rollout.selection.dynamic_sampling",
    "rollout.dynamic_sampling_reward": "rollout.selection.dynamic_sampling_reward",
    "rollout.max_generation_rounds": "rollout.selection.max_generation_rounds",
    "rollout.gfpo_keep": "rollout.selection.gfpo_keep",
    "rollout.gfpo_metric": "rollout.selection.gfpo_metric",
    "rollout.overlong_filter": "rollout.selection.overlong_filter",
    "rollout.val_samples": "rollout.evaluation.samples",
    "rollout.val_pass_k": "rollout.evaluation.pass_k",
    "rollout.val_pass_threshold": "rollout.evaluation.pass_threshold",
    "rollout.lora_sync": "rollout.weight_sync.lora",
    "rollout.forward_rows": "model.forward.rows_per_pass",
    "rollout.async_correction": "model.loss.init_args.off_policy.correction (the loss's correction; rollout.max_staleness "
                                ">= 1 needs one)",
}

# ---------------------------------------------------------------- data.* (PromptDataModule, SFTDataModule)
DATA_RENAMES: dict[str, str] = {
}

RENAMED.update(MODULE_RENAMES)
RENAMED.update(LOSS_RENAMES)
RENAMED.update(ROLLOUT_RENAMES)
RENAMED.update(DATA_RENAMES)


def renamed_key_message(key: str) -> str | None:
    """One line for an old ``key`` (``"rollout.vllm_args.max_model_len"``), or None when it was not renamed.

    A key under a renamed parent is answered through the parent (``rollout.vllm_args.dtype`` ->
    ``rollout.vllm_args`` was replaced by ...)."""
    parts = key.split(".")
    for end in range(len(parts), 0, -1):
        old = ".".join(parts[:end])
        if old in RENAMED:
            return f"{key}: '{old}' was renamed in lightning-grpo 0.1.0: use {RENAMED[old]}"
    return None
