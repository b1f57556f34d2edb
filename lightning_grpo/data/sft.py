"""SFTDataModule: supervised fine-tuning data (answers, or whole chat transcripts) for
`SFTModule`, the warm start before GRPO.

The rows come from the same sources as `PromptDataModule`
(files, rows in memory, a ``DataSource`` such as the built-in digit task, whose ``answer`` column is
the right answer) through the same mapping hook, tokenizer loading and validation split; they become
examples with an assistant-only loss mask (`lightning_grpo.data.sft_format`). A batch is
``{"input_ids", "attention_mask", "loss_mask"}``, each ``[B, L]``, padded on the right (``loss_mask``: each
token's loss weight, 0 off the assistant turns).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader

from .chat_prefix import rewrite_warning
from .datamodule import PromptDataModule
from .records import PromptFormat, RowFormat
from .sft_format import INPUT_IDS, LOSS_MASK, SFTFormat
from .sources import DataSource

#: What a rewriting template means for SFT (the end of the chat-template warning).
SFT_CONSEQUENCE = (
    "SFT trains on the whole transcript's rendering: that turn is trained on other tokens than the model writes "
    "when it is sampled there (its own rendering), and the later turns on a history a multi-turn run, which keeps "
    "the sampled tokens, never shows"
)


@dataclass
class SFTFormatSettings(RowFormat):
    """How rows become SFT examples (``data.format`` of `SFTDataModule`): `RowFormat`'s columns, mapping hook and
    chat template, the transcript columns, the last turn's weight and the example length limit.

    ``answer_column`` is the answer the policy is taught to give (it cannot be null); with ``use_chat_template``
    the answer is the assistant turn, without it the prompt tokens come as GRPO feeds them, then the answer and
    EOS. With ``chat_template_kwargs: {enable_thinking: false}`` Qwen3's generation prompt and last turn share the
    empty ``<think>`` block, which falls outside the loss.
    """

    messages_column: str = "messages"
    """Column of whole chat transcripts (used instead of prompt / answer when the rows hold it; needs
    ``use_chat_template``)."""
    tools_column: str = "tools"
    """Column of the tool schemas a transcript's template announces (optional)."""
    last_turn_weight: float = 1.0
    """Loss weight of the last assistant turn's tokens (the other assistant tokens weigh 1; the loss is the
    weighted token mean): above 1, a transcript's final answer counts for more than the tool-call text before
    it (ms-swift's ``loss_scale``). 1: every assistant token alike."""
    max_length: int | None = None
    """Longest example in tokens (an error names a longer row); ``None`` for no limit."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.answer_column is None:
            raise ValueError("data.format.answer_column names the answer SFT teaches; it cannot be null")
        for name in ("messages_column", "tools_column"):
            if not (isinstance(getattr(self, name), str) and getattr(self, name)):
                raise ValueError(f"data.format.{name} must name a column, got {getattr(self, name)!r}")
        max_length = self.max_length
        if max_length is not None and (
            isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1
        ):
            raise ValueError(f"data.format.max_length must be a positive integer or null, got {max_length!r}")

    def prompt_format(self) -> PromptFormat:
        """The `PromptFormat` with these columns, hook and template (no prompt limit): how the rows are read."""
        return PromptFormat(**{f.name: getattr(self, f.name) for f in fields(RowFormat)})


class SFTDataModule(PromptDataModule):
    """Supervised examples, tokenized once with the policy's tokenizer (guide: docs/guide/sft.md).

    Keyword arguments only. ``source``, ``train_files`` / ``val_files`` / ``test_files``,
    ``tokenizer_path``, ``batch_size`` (examples per training step), ``val_batch_size``,
    ``val_fraction``, ``shuffle`` and ``seed`` are as in ``PromptDataModule``.

    Args:
        format: How rows become examples (`SFTFormatSettings`): the prompt, answer and transcript columns,
            mapping hook and chat template, the last assistant turn's loss weight and the example length limit.
    """

    def __init__(
        self,
        *,
        source: DataSource | None = None,
        train_files: str | list[str] | None = None,
        val_files: str | list[str] | None = None,
        test_files: str | list[str] | None = None,
        tokenizer_path: str | None = None,
        format: SFTFormatSettings = SFTFormatSettings(),  # noqa: B008 - a settings value shown by --help, read and never mutated
        batch_size: int = 8,
        val_batch_size: int | None = None,
        val_fraction: float | None = None,
        shuffle: bool = True,
        seed: int = 0,
    ) -> None:
        if not isinstance(format, SFTFormatSettings):
            raise TypeError(f"data.format must be a lightning_grpo.SFTFormatSettings, got {type(format).__name__}")
        super().__init__(
            source,
            train_files=train_files,
            val_files=val_files,
            test_files=test_files,
            tokenizer_path=tokenizer_path,
            format=format.prompt_format(),
            batch_size=batch_size,
            val_batch_size=val_batch_size,
            val_fraction=val_fraction,
            shuffle=shuffle,
            seed=seed,
        )
        if not callable(format.record_map):
            self.hparams["format"] = asdict(format)  # plain values
        self._builder = SFTFormat(
            prompt_column=format.prompt_column,
            answer_column=format.answer_column,
            messages_column=format.messages_column,
            tools_column=format.tools_column,
            use_chat_template=format.use_chat_template,
            system_prompt=format.system_prompt,
            max_length=format.max_length,
            chat_template_kwargs=format.chat_template_kwargs,
            last_turn_weight=format.last_turn_weight,
        )

    def setup(self, stage: str | None = None) -> None:
        """`PromptDataModule.setup`, then the chat-template check on the first ``data.format.template_check_rows``
        training rows (:func:`~lightning_grpo.data.chat_prefix.rewrite_warning`): one warning when the template
        renders an earlier turn differently once more messages follow it."""
        fresh = self.train_records is None
        super().setup(stage)
        if not fresh or not self.format.template_check_rows:
            return
        rows = self.train_records[: self.format.template_check_rows]
        conversations = self._builder.conversations(rows, self.source.describe("train"))
        line = rewrite_warning(self.tokenizer, conversations, SFT_CONSEQUENCE, self.format.chat_template_kwargs)
        if line is not None:
            rank_zero_warn(line)

    def _loader(self, examples: list[dict[str, Any]], batch_size: int, shuffle: bool) -> DataLoader:
        generator = torch.Generator().manual_seed(self.seed)
        pad = self.tokenizer.pad_token_id
        return DataLoader(
            examples,
            batch_size=batch_size,
            shuffle=shuffle,
            generator=generator,
            collate_fn=lambda rows: collate(rows, pad),
        )

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
