"""The chat-template check of multi-turn rollouts (run by :meth:`~lightning_grpo.plan.run_plan.RunPlan.resolve`,
before any engine starts): made-up episodes opened by the first training rows are rendered message by message
(:mod:`lightning_grpo.data.chat_prefix`), and a template that renders an earlier turn differently once more
messages follow it (Qwen3's drops the ``<think>`` blocks before the last user message) is one warning.

A warning, not an error: the episodes train on the token ids they sampled, never on a re-rendering. What differs
is what the conversation looks like elsewhere: a server that renders it with the template (a chat API) shows the
trained model another history, and SFT transcripts rendered with it train those turns on other tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

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


def check_chat_template(dm: PromptDataModule, conversations_of: Callable[[list[dict]], list]) -> None:
    """Warn (rank zero) when the run's multi-turn episodes meet a chat template that rewrites earlier turns; the
    episodes are ``conversations_of`` (the rollout callback's ``template_conversations``) the first
    ``data.format.template_check_rows`` training records (single-turn rollouts have none: a prompt is rendered
    once, a completion never)."""
    rows, tokenizer = dm.format.template_check_rows, dm.tokenizer
    if not rows or tokenizer is None or not getattr(tokenizer, "chat_template", None):  # a transformers tokenizer
        return
    conversations = conversations_of(dm.train_records[:rows])
    if not conversations:
        return
    line = rewrite_warning(tokenizer, conversations, AGENT_CONSEQUENCE)
    if line is not None:
        rank_zero_warn(line)
