"""The chat-template check of agent runs (lightning_grpo.checks.chat_template): ``trainer.fit`` warns, before any
engine is built, when made-up episodes opened by the training rows render an earlier turn differently once the
environment answers (Qwen3 drops the <think> block before a user message); tool results keep it (silent)."""

from __future__ import annotations

import warnings

import pytest

from lightning_grpo.agents import AgentRolloutCallback, AgentSettings
from lightning_grpo.checks.chat_template import AGENT_CONSEQUENCE
from lightning_grpo.data.chat_prefix import rewrite_warning
from lightning_grpo.data.datamodule import PromptDataModule
from lightning_grpo.data.tasks import DigitTask
from lightning_grpo.rollout.base import SamplingConfig
from tests.helpers.bad_input import fit_error

pytestmark = pytest.mark.usefixtures("tiny_cache")

RECORDS = [{"prompt": "4821=", "raw_prompt": "4821=", "answer": "2"}]


def test_fit_warns_before_any_engine_starts(qwen_tokenizer):
    """``trainer.fit`` of an agent run on the Qwen3 tokenizer whose environment answers with user messages
    (secret_digit without tools): the warning comes from the fit checks (``RolloutCallback.setup``, which the
    command line's ``before_fit`` runs too); the run then stops at the vocabulary check after it (the tiny policy
    has fewer embedding rows than Qwen3 has tokens), with no engine built and nothing trained."""
    agent = AgentRolloutCallback(
        agent=AgentSettings(environment="secret_digit", environment_args={"tools_enabled": False}, max_turns=2),
        engine="hf",
        sampling=SamplingConfig(n=4, max_new_tokens=3),
        seed=0,
    )
    dm = PromptDataModule(DigitTask(), batch_size=4)
    dm.tokenizer = qwen_tokenizer  # the session's tokenizer (setup loads tokenizer_path otherwise)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit_error(ValueError, "it has 151669 tokens, the policy's embedding", callback=agent, dm=dm)
    lines = [str(w.message) for w in caught if "chat template" in str(w.message)]
    # <|im_start|> user \n 4 8 2 1 = <|im_end|> \n <|im_start|> assistant \n: tokens 0-12, then the probe's turn
    assert lines == [
        "the chat template rewrites earlier turns: in an episode opened by training row 0, appending message 2 (user) "
        "changes how message 1 (assistant) renders: token 13 '<think>' (id 151667) becomes 'A' (id 32) (4 of 4 "
        f"conversations checked). {AGENT_CONSEQUENCE} (docs/guide/troubleshooting.md#the-chat-template-rewrites-earlier-turns)"
    ]


def test_tool_results_keep_the_reasoning_and_one_turn_renders_nothing(qwen_tokenizer):
    """Qwen3 keeps the <think> block of the turns after the last user message: an environment with tools (its
    answers are tool results) is silent; ``max_turns: 1`` has no later turn to render."""
    tools = AgentRolloutCallback(agent=AgentSettings(environment="secret_digit", max_turns=2))
    conversations = tools.template_conversations(RECORDS)
    assert [m["role"] for m in conversations[0][0]] == ["user", "assistant", "tool", "assistant"]
    assert rewrite_warning(qwen_tokenizer, conversations, AGENT_CONSEQUENCE) is None
    user = AgentRolloutCallback(
        agent=AgentSettings(environment="secret_digit", environment_args={"tools_enabled": False}, max_turns=2)
    )
    assert rewrite_warning(qwen_tokenizer, user.template_conversations(RECORDS), AGENT_CONSEQUENCE) is not None
    assert (
        AgentRolloutCallback(agent=AgentSettings(environment="secret_digit", max_turns=1)).template_conversations(
            RECORDS
        )
        == []
    )
