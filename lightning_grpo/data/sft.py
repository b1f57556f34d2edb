"""SFTDataModule: supervised fine-tuning data (answers, or whole chat transcripts) for
:class:`~lightning_grpo.training.sft.SFTModule`, the warm start before GRPO.

The rows come from the same sources as :class:`~lightning_grpo.data.datamodule.PromptDataModule`
(files, a ``datasets`` dataset, a ``DataSource``, or the built-in digit task, whose ``answer`` column is
the right answer) through the same mapping hook, tokenizer loading and validation split; they become
examples with an assistant-only loss mask (:mod:`lightning_grpo.data.sft_format`). A batch is
``{"input_ids", "attention_mask", "loss_mask"}``, each ``[B, L]``, padded on the right (``loss_mask``: each
token's loss weight, 0 off the assistant turns).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader

from .datamodule import PromptDataModule
from .records import RecordMap
from .sft_format import INPUT_IDS, LOSS_MASK, SFTFormat
from .sources import DataSource


class SFTDataModule(PromptDataModule):
    """Supervised examples, tokenized once with the policy's tokenizer (guide: docs/sft.md).

    Args:
        source / train_files / val_files / train_dataset / val_dataset / test_files / test_dataset / record_map / tokenizer_path /
            val_fraction / seed / shuffle / task_* / cache_dir: as in ``PromptDataModule``.
        prompt_column: Column of the prompt (text, or chat messages with ``use_chat_template``).
        answer_column: Column of the answer the policy is taught to give.
        messages_column: Column of whole chat transcripts (used instead of prompt / answer when the
            rows hold it; needs ``use_chat_template``).
        tools_column: Column of the tool schemas a transcript's template announces (optional).
        use_chat_template: Render through the tokenizer's chat template (the answer as the assistant
            turn); false: prompt tokens as GRPO feeds them, then the answer and EOS.
        system_prompt: System message put before each prompt (needs ``use_chat_template``).
        batch_size: Examples per training step.
        val_batch_size: Examples per validation batch; defaults to ``batch_size``.
        max_length: Longest example in tokens (an error names a longer row); ``None`` for no limit.
        chat_template_kwargs: Extra keyword arguments of the chat template, as ``PromptDataModule``'s (e.g.
            ``{enable_thinking: false}``: Qwen3's generation prompt and last turn then share the empty
            ``<think>`` block, which falls outside the loss).
        last_turn_weight: Loss weight of the last assistant turn's tokens (the other assistant tokens weigh 1;
            the loss is the weighted token mean): above 1, a transcript's final answer counts for more than
            the tool-call text before it (ms-swift's ``loss_scale``). Default 1: every assistant token alike.
    """

    def __init__(
        self,
        source: DataSource | None = None,
        train_files: str | list[str] | None = None,
        val_files: str | list[str] | None = None,
        train_dataset: Any = None,
        val_dataset: Any = None,
        test_files: str | list[str] | None = None,
        test_dataset: Any = None,
        record_map: str | RecordMap | None = None,
        tokenizer_path: str | None = None,
        prompt_column: str = "prompt",
        answer_column: str = "answer",
        messages_column: str = "messages",
        tools_column: str = "tools",
        use_chat_template: bool = False,
        system_prompt: str | None = None,
        val_fraction: float | None = None,
        batch_size: int = 8,
        val_batch_size: int | None = None,
        max_length: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        task_seed: int = 0,
        task_rule: str = "last_plus_one",
        task_num_train: int = 300,
        task_num_val: int = 50,
        task_num_test: int = 50,
        cache_dir: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        last_turn_weight: float = 1.0,
    ) -> None:
        super().__init__(
            source, train_files, val_files, train_dataset, val_dataset, test_files, test_dataset, record_map, tokenizer_path,
            prompt_column, answer_column, use_chat_template, system_prompt, val_fraction, batch_size, val_batch_size,
            max_length, seed=seed, shuffle=shuffle, task_seed=task_seed, task_rule=task_rule, task_num_train=task_num_train,
            task_num_val=task_num_val, task_num_test=task_num_test, cache_dir=cache_dir, chat_template_kwargs=chat_template_kwargs,
        )  # fmt: skip
        self.format = SFTFormat(prompt_column, answer_column, messages_column, tools_column, use_chat_template,
                                system_prompt, max_length, chat_template_kwargs, last_turn_weight)  # fmt: skip

    def _loader(self, examples: list[dict[str, Any]], batch_size: int, shuffle: bool) -> DataLoader:
        generator = torch.Generator().manual_seed(self.seed)
        pad = self.tokenizer.pad_token_id
        return DataLoader(examples, batch_size=batch_size, shuffle=shuffle, generator=generator,
                          collate_fn=lambda rows: collate(rows, pad))  # fmt: skip

    def train_dataloader(self) -> DataLoader:
        return self._loader(self._records("train"), self.batch_size, self.shuffle)

    def val_dataloader(self) -> DataLoader | list:
        examples = self._records("val")
        return self._loader(examples, self.val_batch_size, False) if examples else []

    def test_dataloader(self) -> DataLoader:
        super().test_dataloader()  # an error when there is no test split
        return self._loader(self._records("test"), self.val_batch_size, False)


def collate(rows: list[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """Examples -> ``input_ids`` / ``attention_mask`` / ``loss_mask``, each [B, L] (right padding)."""
    width = max(len(r[INPUT_IDS]) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # [B, L]
    attention = torch.zeros(len(rows), width, dtype=torch.long)  # [B, L]
    loss = torch.zeros(len(rows), width)  # [B, L] float
    for i, r in enumerate(rows):
        n = len(r[INPUT_IDS])
        ids[i, :n] = torch.tensor(r[INPUT_IDS])
        attention[i, :n] = 1
        loss[i, :n] = torch.tensor(r[LOSS_MASK], dtype=torch.float)
    return {"input_ids": ids, "attention_mask": attention, "loss_mask": loss}
