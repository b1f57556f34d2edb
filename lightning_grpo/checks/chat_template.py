"""The chat-template check of multi-turn rollouts (part of :func:`~lightning_grpo.checks.validation.check_fit_config`,
before any engine starts): made-up episodes opened by the first training rows are rendered message by message
(:mod:`lightning_grpo.data.chat_prefix`), and a template that renders an earlier turn differently once more
messages follow it (Qwen3's drops the ``<think>`` blocks before the last user message) is one warning.

A warning, not an error: the episodes train on the token ids they sampled, never on a re-rendering. What differs
is what the conversation looks like elsewhere: a server that renders it with the template (a chat API) shows the
trained model another history, and SFT transcripts rendered with it train those turns on other tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning.pytorch.utilities import rank_zero_warn

from ..data.chat_prefix import rewrite_warning

if TYPE_CHECKING:
    from ..data.datamodule import PromptDataModule

#: What a rewriting template means for an agent run (the end of the warning).
AGENT_CONSEQUENCE = (
    "This run trains on the tokens its episodes sampled, with the earlier turns as sampled; a server that renders "
    "the conversation with this template (a chat API) shows the trained model another history, and SFT transcripts "
    "rendered with it train those turns on other tokens"
)


def check_chat_template(dm: PromptDataModule, callback: Any) -> None:
    """Warn (rank zero) when the run's multi-turn episodes meet a chat template that rewrites earlier turns; the
    episodes are the callback's ``template_conversations`` of the first ``data.format.template_check_rows``
    training records (single-turn rollouts have none: a prompt is rendered once, a completion never).
    ``callback``: the run's :class:`~lightning_grpo.RolloutCallback` (a layer above this one)."""
    rows, tokenizer = dm.format.template_check_rows, dm.tokenizer
    if not rows or tokenizer is None or not getattr(tokenizer, "chat_template", None):  # a transformers tokenizer
        return
    conversations = callback.template_conversations(dm.train_records[:rows])
    if not conversations:
        return
    line = rewrite_warning(tokenizer, conversations, AGENT_CONSEQUENCE)
    if line is not None:
        rank_zero_warn(line)
