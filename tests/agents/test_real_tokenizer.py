"""Tool calling and token-in-token-out episodes through the real Qwen3 tokenizer and chat template
(``qwen_tokenizer`` in conftest): the ``# Tools`` system block, ``<tool_call>`` parsing,
``<tool_response>`` framing between turns, and re-tokenisation drift with real BPE merges."""

from __future__ import annotations

import json

import pytest

from lightning_grpo.agents.calculator import CalculatorEnv, calculate
from lightning_grpo.agents.chat import ChatRenderer
from lightning_grpo.agents.environment import Turn
from lightning_grpo.agents.episodes import EpisodeLimits, run_episodes
from lightning_grpo.agents.tools import parse_tool_calls, tool_schema
from lightning_grpo.rollout.base import SamplingConfig, rollout_to_tensors
from tests.helpers.agents import ScriptedEngine, ids_of

IM_END, TOOL_CALL, TOOL_CALL_END = 151645, 151657, 151658  # <|im_end|>, <tool_call>, </tool_call> (Qwen2.5 / Qwen3)
CALL = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "(3 + 4) * 12"}}\n</tool_call>'
TOOLS_BLOCK = (
    "<|im_start|>system\nYou add up.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{schema}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
    'XML tags:\n<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call><|im_end|>\n'
)
OPENING = [{"role": "system", "content": "You add up."}, {"role": "user", "content": "What is (3 + 4) * 12?"}]


def response(result: str) -> str:
    """What the template writes between a turn that stopped at ``</tool_call>`` and the next turn."""
    return (
        f"<|im_end|>\n<|im_start|>user\n<tool_response>\n{result}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def episodes(tok, script, n_rows=1):
    """Calculator episodes on scripted turns, with the callback's stop ids (<|im_end|>, </tool_call>)."""
    env = CalculatorEnv(system_prompt="You add up.")
    sampling = SamplingConfig(n=1, max_new_tokens=64, stop_token_ids=[IM_END, TOOL_CALL_END])
    engine = ScriptedEngine(script, eos_id=IM_END)
    records = [{"question": "What is (3 + 4) * 12?", "answer": "84"}] * n_rows

    def make():
        return CalculatorEnv(system_prompt="You add up.")

    out = run_episodes(
        engine, make, tok, ChatRenderer(tok, env.tools), records, sampling, seed=0, limits=EpisodeLimits(max_turns=3)
    )
    return engine, out


def test_tool_schema_in_the_qwen3_system_block(qwen_tokenizer):
    schema = tool_schema(calculate)
    assert schema["function"]["name"] == "calculate" and schema["function"]["parameters"]["required"] == ["expression"]
    text = ChatRenderer(qwen_tokenizer, [calculate]).render(OPENING, add_generation_prompt=True)
    user = "<|im_start|>user\nWhat is (3 + 4) * 12?<|im_end|>\n<|im_start|>assistant\n"
    assert text == TOOLS_BLOCK.format(schema=json.dumps(schema)) + user


@pytest.mark.parametrize(
    "before, content, thinking",
    [
        ("", "", None),
        ("Let me compute.\n", "Let me compute.", None),
        ("<think>\nmultiply\n</think>\n\n", "", "multiply"),
    ],
)
def test_qwen3_tool_call_parses_and_runs(qwen_tokenizer, before, content, thinking):
    """Sampled ids of a Qwen3-format call (the markers are single tokens) -> name, arguments, the result; a
    <think> block goes to ``thinking``, not into the content."""
    ids = ids_of(qwen_tokenizer, before + CALL)
    assert ids.count(TOOL_CALL) == 1 and ids[-1] == TOOL_CALL_END
    text = qwen_tokenizer.decode(ids, skip_special_tokens=False)
    message, error = parse_tool_calls(qwen_tokenizer, text)
    assert error is None and message["content"] == content and message.get("reasoning_content") == thinking
    assert message["tool_calls"] == [
        {"type": "function", "function": {"name": "calculate", "arguments": {"expression": "(3 + 4) * 12"}}}
    ]
    env = CalculatorEnv()
    env.tokenizer = qwen_tokenizer
    step = env.step(Turn(ids=ids, text=text, index=0, finished=True))
    assert step.messages == [{"role": "tool", "name": "calculate", "content": "84"}] and not step.done


def test_calculator_episode_through_the_qwen3_template(qwen_tokenizer):
    """Call, tool response, answer: the context of turn 1 is exactly the Qwen3 template's rendering of the
    conversation so far. Qwen3 renders a final assistant message with an empty <think> block and a
    non-final one without it, so "render(history + new) - render(history)" does not apply (it raised)."""
    tok = qwen_tokenizer
    thinking = "<think>\nmultiply\n</think>\n\n"
    turns = {0: [CALL, "84<|im_end|>"], 1: [thinking + CALL, "It is 84.<|im_end|>"]}
    engine, out = episodes(tok, lambda call, row, prompt: ids_of(tok, turns[row][call]), n_rows=2)
    for row, ep in enumerate(out.episodes):
        call, answer = ids_of(tok, turns[row][0]), ids_of(tok, turns[row][1])
        obs = ids_of(tok, response("84"))
        assert out.completion_ids[row] == call + obs + answer
        assert out.turn_ids[row] == [0] * len(call) + [-1] * len(obs) + [1] * len(answer)
        assert out.logprobs[row] == pytest.approx(
            [-(k + 1) / 10 - row / 100 for k in range(len(call))]
            + [0.0] * len(obs)
            + [-(k + 1) / 10 - row / 100 for k in range(len(answer))]
        )
        assert ep.reward == 0.0 and not ep.truncated and ep.last_text == turns[row][1][: -len("<|im_end|>")]
        assert [m["role"] for m in ep.messages] == ["system", "user", "assistant", "tool", "assistant"]
        # what the model saw before its second turn = the template's rendering of the conversation so far
        assert engine.prompts[1][row] == ids_of(
            tok, ChatRenderer(tok, [calculate]).render(ep.messages[:4], add_generation_prompt=True)
        )
    assert out.prompt_ids[0] == ids_of(
        tok,
        TOOLS_BLOCK.format(schema=json.dumps(tool_schema(calculate)))
        + "<|im_start|>user\nWhat is (3 + 4) * 12?<|im_end|>\n<|im_start|>assistant\n",
    )


def test_user_feedback_turn_through_the_qwen3_template(qwen_tokenizer):
    """An environment that answers with a user message (no tools): Qwen3 then renders the model's message
    without the empty <think> block too; the new tokens are the user turn and the generation prompt."""
    renderer = ChatRenderer(qwen_tokenizer)
    history = [{"role": "user", "content": "Guess a digit."}, {"role": "assistant", "content": "7"}]
    new = [{"role": "user", "content": "Higher."}]
    ids = renderer.observation_ids(history, new, "7<|im_end|>")
    assert ids == ids_of(qwen_tokenizer, "\n<|im_start|>user\nHigher.<|im_end|>\n<|im_start|>assistant\n")
    full = renderer.render(history + new, add_generation_prompt=True)  # the turn as sampled + the new ids
    head = full[: full.index("7<|im_end|>")]
    assert ids_of(qwen_tokenizer, full) == ids_of(qwen_tokenizer, head) + ids_of(qwen_tokenizer, "7<|im_end|>") + ids


def test_template_that_drops_the_model_message_is_refused_by_name():
    """A template that renders a non-final assistant message without its content: the end of the model's
    message cannot be found, so the new messages cannot be tokenised on their own; one clear error."""
    from lightning_grpo.models.tiny import build_char_tokenizer

    tok = build_char_tokenizer("tools")
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role != 'assistant' or loop.last %}{{ m.content }}{% endif %}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    renderer = ChatRenderer(tok)
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    expected = r"first difference at character 52: 'yo<\|im_end\|>\\n' vs '<\|im_end\|>\\n<\|im_start\|>user"
    with pytest.raises(
        ValueError, match=r"renders the conversation differently once new messages follow it.*" + expected
    ):
        renderer.observation_ids(history, [{"role": "user", "content": "ok"}], "yo<|im_end|>")


def split_one_token(tok, ids: list[int]) -> list[int]:
    """``ids`` with its first token that two vocabulary tokens also spell replaced by those two (searched
    over the real vocabulary): the same text, ids that decode -> encode does not give back."""
    vocab = tok.get_vocab()  # byte-level token strings -> ids
    for i, piece in enumerate(tok.convert_ids_to_tokens(ids)):
        for k in range(1, len(piece)):
            if piece[:k] in vocab and piece[k:] in vocab:
                return ids[:i] + [vocab[piece[:k]], vocab[piece[k:]]] + ids[i + 1 :]
    raise AssertionError("no token of the call splits into two vocabulary tokens")


def test_real_bpe_drift_trains_the_sampled_ids(qwen_tokenizer):
    """The model spells one token of its call as two (a split the real BPE never produces): the text is the
    same call, re-encoding it gives different ids; the episode keeps the sampled ids and log-probs, the call runs."""
    tok = qwen_tokenizer
    canonical = ids_of(tok, CALL)
    spelled = split_one_token(tok, canonical)
    text = tok.decode(spelled, skip_special_tokens=False)
    assert text == CALL and ids_of(tok, text) == canonical != spelled and len(spelled) == len(canonical) + 1
    engine, out = episodes(tok, lambda call, row, prompt: spelled if call == 0 else ids_of(tok, "84<|im_end|>"))
    n = len(spelled)
    assert out.completion_ids[0][:n] == spelled and out.turn_ids[0][:n] == [0] * n and out.turn_ids[0][n] == -1
    assert out.logprobs[0][:n] == pytest.approx([-(k + 1) / 10 for k in range(n)])
    assert out.episodes[0].messages[3] == {"role": "tool", "name": "calculate", "content": "84"}
    assert engine.prompts[1][0] == out.prompt_ids[0] + spelled + ids_of(
        tok, response("84")
    )  # the sampled ids, not re-encoded
    tensors = rollout_to_tensors(out, pad_id=tok.pad_token_id)
    Lp = len(out.prompt_ids[0])
    assert tensors.input_ids[0, Lp : Lp + n].tolist() == spelled  # what the trainer scores
    assert tensors.rollout_logprobs[0, :n].tolist() == pytest.approx(out.logprobs[0][:n])
    env, answer = len(ids_of(tok, response("84"))), len(ids_of(tok, "84<|im_end|>"))
    assert tensors.completion_mask[0].tolist() == [1.0] * n + [0.0] * env + [1.0] * answer


def test_qwen3_answer_after_an_empty_think_block_is_scored(qwen_tokenizer):
    """Qwen3's template trains a final answer as ``<think>\\n\\n</think>\\n\\n7<|im_end|>`` (an SFT transcript's last
    turn): the environment scores the content after the block, so such an answer is right."""
    from lightning_grpo.agents.secret_digit import SecretDigitEnv

    env = SecretDigitEnv(question="secret")
    env.tokenizer = qwen_tokenizer
    env.reset({}, seed=3)
    ids = ids_of(qwen_tokenizer, f"<think>\n\n</think>\n\n{env.secret}<|im_end|>")
    step = env.step(Turn(ids=ids, text=qwen_tokenizer.decode(ids, skip_special_tokens=False), index=1, finished=True))
    assert step.done and step.reward == 1.0 and step.assistant["content"] == env.secret
