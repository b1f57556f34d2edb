"""Token-in-token-out episodes on scripted turns: exact ids, masks, log-probs, limits."""

from __future__ import annotations

import re

import pytest

from lightning_grpo.agents.chat import ChatRenderer
from lightning_grpo.agents.environment import Environment, Step
from lightning_grpo.agents.episodes import EpisodeLimits, run_episodes
from lightning_grpo.agents.secret_digit import SecretDigitEnv
from lightning_grpo.rollout.base import SamplingConfig, rollout_to_tensors
from tests.helpers.agents import ScriptedEngine, ids_of, tools_tokenizer

CALL_TEXT = '<tool_call>\n{"name": "secret_digit", "arguments": {}}\n</tool_call>'


@pytest.fixture(scope="module")
def tok():
    return tools_tokenizer()


def setup(tok, script, n=1, max_turns=3, **limits):
    env = SecretDigitEnv()
    renderer = ChatRenderer(tok, env.tools)
    stops = [tok.convert_tokens_to_ids("<|im_end|>"), *ids_of(tok, "</tool_call>"), *ids_of(tok, CALL_TEXT)]
    sampling = SamplingConfig(n=n, max_new_tokens=60, stop_token_ids=stops)
    records = [{"prompt": "4821=", "prompt_ids": [9], "answer": "2"}]
    return ScriptedEngine(script), renderer, records, sampling, EpisodeLimits(max_turns=max_turns, **limits)


def answer_secret(tok):
    """Turn 0: call the tool; turn 1: copy the digit from the tool response, then <|im_end|>."""

    def script(call, row, prompt):
        if call == 0:
            return ids_of(tok, CALL_TEXT)
        digit = re.findall(r"<tool_response>\n(\d)", tok.decode(prompt))[-1]
        return ids_of(tok, digit + "<|im_end|>")

    return script


def test_secret_digit_episode_ids_masks_logprobs(tok):
    engine, renderer, records, sampling, limits = setup(tok, answer_secret(tok))
    out = run_episodes(engine, SecretDigitEnv, tok, renderer, records, sampling, seed=3, limits=limits)
    ep = out.episodes[0]
    secret = ep.env.secret
    call = ids_of(tok, CALL_TEXT)
    assert call == [tok.convert_tokens_to_ids(CALL_TEXT)]  # the tiny tools tokenizer spells the call as one token
    obs = ids_of(
        tok,
        f"<|im_end|>\n<|im_start|>user\n<tool_response>\n{secret}\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
    )
    answer = ids_of(tok, secret + "<|im_end|>")
    assert out.prompt_ids[0] == ids_of(
        tok,
        "<|im_start|>system\ntools: secret_digit<|im_end|>\n<|im_start|>user\n4821=<|im_end|>\n<|im_start|>assistant\n",
    )
    assert out.completion_ids[0] == call + obs + answer
    assert out.turn_ids[0] == [0] + [-1] * len(obs) + [1, 1]
    assert out.logprobs[0] == pytest.approx([-0.1] + [0.0] * len(obs) + [-0.1, -0.2])
    assert out.finished == [True] and ep.turns == 2 and ep.reward == 1.0 and ep.last_text == secret
    assert [m["role"] for m in ep.messages] == ["user", "assistant", "tool", "assistant"]
    assert ep.messages[2]["content"] == secret
    # the second engine call saw exactly prompt + sampled call + environment tokens
    assert engine.prompts[1] == [out.prompt_ids[0] + call + obs]
    tensors = rollout_to_tensors(out, pad_id=0)
    Lp = len(out.prompt_ids[0])
    assert tensors.input_ids[0, Lp:].tolist() == call + obs + answer
    assert tensors.completion_mask[0].tolist() == [1.0] + [0.0] * len(obs) + [1.0, 1.0]
    assert tensors.turn_ids[0].tolist() == out.turn_ids[0]
    # the whole trajectory is what the chat template renders for the transcript (up to its final "\n")
    assert out.prompt_ids[0] + out.completion_ids[0] == ids_of(tok, renderer.render(ep.messages, False))[:-1]


def test_retokenisation_drift_trains_the_sampled_ids(tok):
    """The model spells the call with 40 single tokens; decode -> encode would give ONE token. The
    trajectory keeps the 40 sampled ids (and their log-probs), and the call still runs."""
    spelled = (
        ids_of(tok, "<tool_call>")
        + ids_of(tok, '\n{"name": "secret_digit", "arguments": {}}\n')
        + ids_of(tok, "</tool_call>")
    )
    text = tok.decode(spelled, skip_special_tokens=False)
    assert text == CALL_TEXT and ids_of(tok, text) != spelled and len(ids_of(tok, text)) == 1

    def script(call, row, prompt):
        return spelled if call == 0 else ids_of(tok, "0<|im_end|>")

    engine, renderer, records, sampling, limits = setup(tok, script)
    out = run_episodes(engine, SecretDigitEnv, tok, renderer, records, sampling, seed=0, limits=limits)
    n = len(spelled)
    assert out.completion_ids[0][:n] == spelled
    assert out.turn_ids[0][:n] == [0] * n and out.turn_ids[0][n] == -1
    assert out.logprobs[0][:n] == pytest.approx([-(k + 1) / 10 for k in range(n)])
    assert out.episodes[0].messages[2] == {
        "role": "tool",
        "name": "secret_digit",
        "content": out.episodes[0].env.secret,
    }
    tensors = rollout_to_tensors(out, pad_id=0)
    Lp = len(out.prompt_ids[0])
    assert tensors.input_ids[0, Lp : Lp + n].tolist() == spelled  # what the trainer scores
    assert tensors.rollout_logprobs[0, :n].tolist() == pytest.approx(out.logprobs[0][:n])


def test_group_rows_and_secrets(tok):
    """A group shares its secret (one reset seed per record); reset_seed="episode" draws one per episode."""
    engine, renderer, records, sampling, limits = setup(tok, answer_secret(tok), n=8)
    out = run_episodes(engine, SecretDigitEnv, tok, renderer, records * 2, sampling, seed=1, limits=limits)
    assert len(out.completion_ids) == 16 and engine.calls == 2
    assert len(engine.prompts[0]) == 16  # every live episode sampled in one engine call per turn
    secrets = [ep.env.secret for ep in out.episodes]
    assert secrets[:8] == [secrets[0]] * 8 and secrets[8:] == [secrets[8]] * 8  # one task per group
    assert all(ep.reward == 1.0 for ep in out.episodes)
    again = run_episodes(
        ScriptedEngine(answer_secret(tok)), SecretDigitEnv, tok, renderer, records * 2, sampling, 1, limits
    )
    assert [e.env.secret for e in again.episodes] == secrets  # seeded
    mixed = run_episodes(
        ScriptedEngine(answer_secret(tok)),
        SecretDigitEnv,
        tok,
        renderer,
        records * 2,
        sampling,
        1,
        limits,
        reset_seed="episode",
    )
    assert len({ep.env.secret for ep in mixed.episodes}) > 3  # drawn per episode
    assert all(ep.reward == 1.0 for ep in mixed.episodes)


def test_secret_digit_question_replaces_the_record_prompt(tok):
    engine, renderer, records, sampling, limits = setup(tok, answer_secret(tok))
    out = run_episodes(
        engine, lambda: SecretDigitEnv(question="secret"), tok, renderer, records, sampling, seed=3, limits=limits
    )
    assert out.prompt_ids[0] == ids_of(
        tok,
        "<|im_start|>system\ntools: secret_digit<|im_end|>\n<|im_start|>user\nsecret<|im_end|>\n<|im_start|>assistant\n",
    )
    assert out.episodes[0].reward == 1.0
    for bad in ("", "  ", 7):
        with pytest.raises(ValueError, match="SecretDigitEnv.question must be a non-empty string"):
            SecretDigitEnv(question=bad)


def test_max_turns_ends_truncated(tok):
    engine, renderer, records, sampling, limits = setup(tok, lambda c, r, p: ids_of(tok, CALL_TEXT), max_turns=2)
    out = run_episodes(engine, SecretDigitEnv, tok, renderer, records, sampling, seed=0, limits=limits)
    ep = out.episodes[0]
    assert ep.turns == 2 and ep.truncated and out.finished == [False]
    assert out.turn_ids[0][-1] == 1  # the last tool result is not appended after the last turn
    assert ep.env.counts["tool_calls"] == 2


def test_episode_token_budget_and_engine_length(tok):
    engine, renderer, records, sampling, limits = setup(
        tok, lambda c, r, p: ids_of(tok, CALL_TEXT), max_episode_tokens=10
    )
    out = run_episodes(engine, SecretDigitEnv, tok, renderer, records, sampling, seed=0, limits=limits)
    assert out.completion_ids[0] == ids_of(tok, CALL_TEXT) and out.finished == [False]  # the observation would overflow
    prompt_len = len(out.prompt_ids[0])
    engine, renderer, records, sampling, limits = setup(tok, answer_secret(tok), max_model_len=prompt_len + 60 + 5)
    out = run_episodes(engine, SecretDigitEnv, tok, renderer, records, sampling, seed=0, limits=limits)
    assert engine.calls == 1 and out.episodes[0].turns == 1 and out.finished == [False]  # no room for turn 2


class EchoEnv(Environment):
    """A plain-text environment: no chat template, observations appended as text."""

    def step(self, turn):
        return Step(messages=" ok=", reward=0.5, done=turn.index == 1)


def test_plain_text_environment(tok):
    engine = ScriptedEngine(lambda c, r, p: ids_of(tok, "ab") + [1])
    sampling = SamplingConfig(n=2, max_new_tokens=8)
    records = [{"prompt": "x", "prompt_ids": ids_of(tok, "12=")}]
    out = run_episodes(engine, EchoEnv, tok, None, records, sampling, seed=0, limits=EpisodeLimits(max_turns=4))
    turn = ids_of(tok, "ab") + [1]
    assert out.completion_ids[0] == turn + ids_of(tok, " ok=") + turn
    assert out.episodes[0].reward == 1.0 and out.finished == [True, True] and out.episodes[0].messages is None


class WrongTypeEnv(Environment):
    def __init__(self, answer):
        self.answer = answer

    def step(self, turn):
        return self.answer


@pytest.mark.parametrize(
    "answer, message",
    [
        ({"messages": "hi", "done": True}, r"WrongTypeEnv\.step must return a lightning_grpo\.agents\.Step, got dict"),
        (Step(reward="1"), r"WrongTypeEnv\.step returned Step\.reward = '1'; expected a finite float"),
        (Step(done=1), r"WrongTypeEnv\.step returned Step\.done = 1; expected a bool"),
        (
            Step(messages=[{"content": "x"}]),
            r"WrongTypeEnv\.step returned Step\.messages, which must be a list of chat messages",
        ),
    ],
)
def test_environment_wrong_return_type_names_class_and_field(tok, answer, message):
    engine = ScriptedEngine(lambda c, r, p: [1])
    records = [{"prompt": "x", "prompt_ids": [9]}]
    with pytest.raises(TypeError, match=message):
        run_episodes(engine, lambda: WrongTypeEnv(answer), tok, None, records, SamplingConfig(n=1), 0, EpisodeLimits())


class WrongResetEnv(Environment):
    def reset(self, record, seed):
        return "hello"


def test_environment_reset_wrong_type(tok):
    with pytest.raises(TypeError, match=r"WrongResetEnv\.reset returned a value that must be a list of chat messages"):
        run_episodes(
            ScriptedEngine(lambda c, r, p: [1]),
            WrongResetEnv,
            tok,
            ChatRenderer(tok),
            [{"prompt_ids": [9]}],
            SamplingConfig(n=1),
            0,
            EpisodeLimits(),
        )


class FinishEnv(Environment):
    """Done at turn 1 when ``stop``, else runs out of turns; finish() pays 0.25 per turn taken."""

    def __init__(self, stop=True, final=None, fail=False):
        self.stop, self.final, self.fail, self.turns, self.finished = stop, final, fail, 0, 0

    def step(self, turn):
        self.turns += 1
        if self.fail:
            raise RuntimeError("step broke")
        return Step(messages=" n=", reward=1.0, done=self.stop and turn.index == 1)

    def finish(self):
        self.finished += 1
        return 0.25 * self.turns if self.final is None else self.final


def test_finish_runs_once_per_episode_and_adds_its_reward(tok):
    engine = ScriptedEngine(lambda c, r, p: [1])
    records = [{"prompt": "x", "prompt_ids": [9]}]
    for stop, turns, truncated in ((True, 2, False), (False, 3, True)):
        out = run_episodes(
            engine,
            lambda stop=stop: FinishEnv(stop),
            tok,
            None,
            records,
            SamplingConfig(n=2),
            0,
            EpisodeLimits(max_turns=3),
        )
        for ep in out.episodes:  # done at turn 1 / truncated after 3 turns: finish ran once either way
            assert (ep.env.finished, ep.turns, ep.truncated, ep.reward) == (
                1,
                turns,
                truncated,
                turns * 1.0 + 0.25 * turns,
            )
    with pytest.raises(TypeError, match=r"FinishEnv\.finish returned = 'x'; expected a finite float"):
        run_episodes(engine, lambda: FinishEnv(final="x"), tok, None, records, SamplingConfig(n=1), 0, EpisodeLimits())
    envs = []
    with pytest.raises(RuntimeError, match="step broke"):  # a failing step still releases every episode
        run_episodes(
            engine,
            lambda: envs.append(FinishEnv(fail=True)) or envs[-1],
            tok,
            None,
            records,
            SamplingConfig(n=2),
            0,
            EpisodeLimits(),
        )
    assert [e.finished for e in envs] == [1, 1]
