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
ROLLOUT_RENAMES: dict[str, str] = {
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
