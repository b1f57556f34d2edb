"""Keys a recipe used before the settings were grouped (0.1.0), each with the key that replaced it.

The package was never released, so there is no compatibility layer: an old key is refused with one
line naming its replacement (:func:`renamed_key_message`), before anything is built.
"""

from __future__ import annotations

#: old dotted key (as written in a recipe or on the command line) -> the new key, or what to write instead.
RENAMED: dict[str, str] = {}

# ---------------------------------------------------------------- model.* (GRPOModule)
MODULE_RENAMES: dict[str, str] = {
    "model.advantage": "model.algorithm.advantage",
    "model.advantage_args": "model.algorithm.advantage_args",
    "model.reward_aggregation": "model.algorithm.reward_aggregation",
    "model.kl_in_reward_coef": "model.algorithm.kl_in_reward.coef",
    "model.num_iterations": "model.algorithm.num_iterations",
    "model.steps_per_generation": "model.algorithm.steps_per_generation",
    "model.dtype": "model.policy.dtype",
    "model.lora": "model.policy.lora",
    "model.quantization": "model.policy.quantization",
    "model.gradient_checkpointing": "model.policy.gradient_checkpointing",
    "model.reference": "model.policy.reference",
    "model.logprob_path": "model.forward.logprob_path",
    "model.logprob_chunk_size": "model.forward.chunk_size",
    "model.logprob_save_probs": "model.forward.save_probs",
    "model.packing": "model.forward.packing",
    "model.prefix_sharing": "model.forward.prefix_sharing",
    "rollout.forward_rows": "model.forward.rows_per_pass",
}

# ---------------------------------------------------------------- model.loss.* (GRPOLoss)
LOSS_RENAMES: dict[str, str] = {
    "model.loss.init_args.beta": "model.loss.init_args.kl.beta",
    "model.loss.init_args.kl_estimator": "model.loss.init_args.kl.estimator",
    "model.loss.init_args.correction": "model.loss.init_args.off_policy.correction",
    "model.loss.init_args.correction_args": "model.loss.init_args.off_policy.correction_args",
    "model.loss.init_args.is_batch_normalize": "model.loss.init_args.off_policy.is_batch_normalize",
    "model.loss.init_args.rejection": "model.loss.init_args.off_policy.rejection",
    "model.loss.init_args.bypass": "model.loss.init_args.off_policy.bypass",
    "model.loss.init_args.off_policy_delta": "model.loss.init_args.off_policy.sequence_mask_delta",
    "model.loss.init_args.entropy_coef": "model.loss.init_args.terms.entropy_coef",
    "model.loss.init_args.llds_coef": "model.loss.init_args.terms.llds_coef",
    "model.loss.init_args.negative_advantage_scale": "model.loss.init_args.terms.negative_advantage_scale",
    "model.loss.init_args.top_entropy_quantile": "model.loss.init_args.terms.top_entropy_quantile",
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
    "data.train_dataset": "data.source: {class_path: lightning_grpo.Rows, init_args: {train: ...}}",
    "data.val_dataset": "data.source.init_args.val (lightning_grpo.Rows)",
    "data.test_dataset": "data.source.init_args.test (lightning_grpo.Rows)",
    "data.cache_dir": "data.source: {class_path: lightning_grpo.Files, init_args: {train: ..., cache_dir: ...}}",
    "data.task_seed": "data.source: {class_path: lightning_grpo.DigitTask, init_args: {seed: ...}}",
    "data.task_rule": "data.source: {class_path: lightning_grpo.DigitTask, init_args: {rule: ...}}",
    "data.task_num_train": "data.source: {class_path: lightning_grpo.DigitTask, init_args: {num_train: ...}}",
    "data.task_num_val": "data.source: {class_path: lightning_grpo.DigitTask, init_args: {num_val: ...}}",
    "data.task_num_test": "data.source: {class_path: lightning_grpo.DigitTask, init_args: {num_test: ...}}",
    "data.prompt_column": "data.format.prompt_column",
    "data.answer_column": "data.format.answer_column",
    "data.use_chat_template": "data.format.use_chat_template",
    "data.system_prompt": "data.format.system_prompt",
    "data.chat_template_kwargs": "data.format.chat_template_kwargs",
    "data.record_map": "data.format.record_map",
    "data.max_prompt_length": "data.format.max_prompt_length",
    "data.on_long_prompt": "data.format.on_long_prompt",
}

RENAMED.update(MODULE_RENAMES)
RENAMED.update(LOSS_RENAMES)
RENAMED.update(ROLLOUT_RENAMES)
RENAMED.update(DATA_RENAMES)


def _plain(key: str) -> str:
    """``model.loss.init_args.beta`` -> ``model.loss.beta``: a recipe may or may not spell ``init_args``."""
    return ".".join(part for part in key.split(".") if part != "init_args")


def renamed_key_message(key: str) -> str | None:
    """One line for an old ``key`` (``"rollout.vllm_args.max_model_len"``), or None when it was not renamed.

    A key under a renamed parent is answered through the parent (``rollout.vllm_args.dtype``: the
    line names ``rollout.vllm_args`` and what replaced it)."""
    table = {_plain(old): new for old, new in RENAMED.items()}
    parts = _plain(key).split(".")
    for end in range(len(parts), 0, -1):
        old = ".".join(parts[:end])
        if old in table:
            return f"{old} was renamed in lightning-grpo 0.1.0: use {table[old]}"
    return None
