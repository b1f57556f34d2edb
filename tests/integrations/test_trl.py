"""TRL-style ``environment_factory`` classes trained unchanged (TRL itself is not needed).

The training run uses the tiny tools model taught to call ``secret_digit`` (tests/helpers/agents.py),
so episodes really call the class's public method as a tool; every episode is then replayed on a
fresh instance (reset with the record, the same tool calls, get_reward) and the rewards the trainer
scored and logged must be exactly those."""

from __future__ import annotations

import re

import pytest
import torch

from lightning_grpo import PromptDataModule, RewardSpec, SamplingConfig
from lightning_grpo.agents import AgentRolloutCallback, AgentSettings
from lightning_grpo.agents.chat import ChatRenderer
from lightning_grpo.agents.episodes import EpisodeLimits, run_episodes
from lightning_grpo.data.records import PromptFormat
from lightning_grpo.data.sources import Rows
from lightning_grpo.integrations.trl import TRLEnvironment
from tests.helpers.agents import CALL_TEXT, ScriptedEngine, caller_model_dir, ids_of, tools_tokenizer
from tests.helpers.integrations import fit


class SecretEnv:
    """Written for TRL's GRPOTrainer(environment_factory=SecretEnv): the secret is the sum of the
    prompt's digits mod 10; the public method ``secret_digit`` is the tool; ``get_reward`` pays per
    look, more for larger secrets (so that it differs between records)."""

    def __init__(self):
        self.secret, self.looked = "", 0

    def reset(self, **kwargs) -> str | None:
        self.secret = str(sum(int(c) for c in kwargs["prompt"] if c.isdigit()) % 10)
        self.looked = 0
        return None

    def secret_digit(self) -> str:
        """Reveal the secret digit of this episode."""
        self.looked += 1
        return self.secret

    def get_reward(self) -> float:
        return self.looked * (int(self.secret) + 1) / 10


def answered_secret(completions, environments, **columns):
    """A reward function in TRL's style: it reads the environment instances."""
    return [1.0 if text[:1] == env.secret else 0.0 for text, env in zip(completions, environments)]


def replay(record: dict, transcript: list[dict]) -> tuple[float, float]:
    """(get_reward, answered_secret) of an episode replayed on a fresh SecretEnv."""
    env = SecretEnv()
    env.reset(**{k: v for k, v in record.items() if k != "prompt_ids"})
    for message in transcript:
        for call in message.get("tool_calls") or []:
            if call["function"]["name"] == "secret_digit":  # the class's only tool: other names never ran
                env.secret_digit(**call["function"]["arguments"])
    answer = transcript[-1].get("content") or ""  # the last model turn (the episode's completion)
    return env.get_reward(), float(answer[:1] == env.secret)


@pytest.fixture(scope="module")
def caller_dir(tmp_path_factory):
    return caller_model_dir(tmp_path_factory)


def test_environment_factory_class_trains_with_its_own_rewards(caller_dir):
    callback = AgentRolloutCallback(
        agent=AgentSettings(
            environment="lightning_grpo.integrations.trl.TRLEnvironment",
            environment_args={"factory": "tests.integrations.test_trl.SecretEnv"},
            max_turns=3,
        ),
        rewards=[RewardSpec("env_reward"), RewardSpec("tests.integrations.test_trl.answered_secret")],
        engine="hf",
        sampling=SamplingConfig(n=4, max_new_tokens=2),
        seed=1,
    )
    logger, recorder = fit(callback, steps=20, model=caller_dir)
    assert len(recorder.rollouts) == len(recorder.scored) == 20
    logged = [logger.series(f"train/reward/{name}/mean") for name in ("env_reward", "answered_secret")]
    calls, env_rewards = 0, []
    for step, (rollout, scored) in enumerate(zip(recorder.rollouts, recorder.scored)):
        direct = torch.tensor(
            [
                replay({k: scored.columns[k][i] for k in ("prompt", "answer", "prompt_ids")}, ep.messages)
                for i, ep in enumerate(rollout.episodes)
            ]
        )  # [B, 2]
        assert torch.equal(scored.rewards.rewards, direct.float())
        assert [logged[0][step], logged[1][step]] == pytest.approx(direct.mean(0).tolist(), abs=1e-6)
        calls += sum(ep.env.env.looked for ep in rollout.episodes)
        env_rewards += direct[:, 0].tolist()
    # Not vacuous: the tool ran (the taught model calls it every turn, so it never answers: the answer
    # reward is checked on scripted episodes below) and get_reward differs between records.
    assert calls > 50 and len(set(env_rewards)) >= 3


def test_reset_observation_is_appended_and_methods_are_tools():
    """reset's string goes at the end of the last user message (TRL's rule); public methods are the tools,
    async ones included; reset / get_reward / private methods / properties are not."""

    class Env:
        def reset(self, **kwargs):
            return " go"

        def secret_digit(self) -> str:
            """Reveal the secret digit of this episode."""
            return "4"

        async def later(self, n: int) -> int:
            """Wait.

            Args:
                n: how long
            """
            return n

        def get_reward(self):
            return 1.0

        def _private(self):
            raise AssertionError("not a tool")

        @property
        def state(self):
            raise AssertionError("properties are not read")

    env = TRLEnvironment(Env, system_prompt="be brief")
    assert [t.__name__ for t in env.tools] == ["later", "secret_digit"]
    assert env.tools[0](n=3) == 3  # the coroutine ran to completion
    record = {"prompt": "12=", "prompt_ids": [1], "answer": "3"}
    assert env.reset(record, seed=0) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "12= go"},
    ]
    chat = [{"role": "user", "content": "hi"}]
    assert env.reset({**record, "prompt": chat}, seed=0)[-1] == {"role": "user", "content": "hi go"}
    assert chat == [{"role": "user", "content": "hi"}]  # the record is left untouched
    assert env.finish() == 1.0


def test_scripted_episode_calls_the_method_and_scores_get_reward():
    tok = tools_tokenizer()

    def script(call, row, prompt):
        if call == 0:
            return ids_of(tok, CALL_TEXT)
        return ids_of(tok, re.findall(r"<tool_response>\n(\d)", tok.decode(prompt))[-1] + "<|im_end|>")

    callback = AgentRolloutCallback(
        agent=AgentSettings(environment=TRLEnvironment, environment_args={"factory": SecretEnv}),
        engine="hf",
        rewards=[RewardSpec("env_reward"), RewardSpec(answered_secret)],
    )
    stops = [tok.convert_tokens_to_ids("<|im_end|>"), *ids_of(tok, CALL_TEXT)]
    records = [{"prompt": "4821=", "prompt_ids": [9]}]
    out = run_episodes(
        ScriptedEngine(script),
        callback.make_env,
        tok,
        ChatRenderer(tok, callback.make_env().tools),
        records,
        SamplingConfig(n=2, max_new_tokens=60, stop_token_ids=stops),
        seed=0,
        limits=EpisodeLimits(max_turns=3),
    )
    for ep in out.episodes:
        assert ep.env.env.looked == 1 and ep.last_text == "5" and ep.reward == 0.6  # 4+8+2+1 = 15; 1 look x 6 / 10
        assert [m["role"] for m in ep.messages] == ["user", "assistant", "tool", "assistant"]
        assert ep.env.unwrapped is ep.env.env
    scores = callback.score(out, records)  # the environments column holds the SecretEnv instances
    assert torch.equal(scores.rewards, torch.tensor([[0.6, 1.0], [0.6, 1.0]]))


# ------------------------------------------------------------------------------ bad input
class NoReset:
    def guess(self, word: str) -> str:
        """Guess.

        Args:
            word: the word
        """
        return word


class Undocumented:
    def reset(self, **kwargs):
        return None

    def move(self, direction):
        return direction


class BadReward:
    def reset(self, **kwargs):
        return 3

    def get_reward(self):
        return "high"


def test_bad_environment_classes():
    with pytest.raises(TypeError, match=r"TRLEnvironment: NoReset has no reset\(\*\*kwargs\) method"):
        TRLEnvironment(NoReset)
    with pytest.raises(
        ValueError,
        match=r"TRLEnvironment: Undocumented\.move is public, so it is a tool, but tool 'move': cannot build its JSON schema",
    ):
        TRLEnvironment(Undocumented)
    with pytest.raises(
        ValueError, match=r"TRLEnvironment\.factory 'tests\.integrations\.test_trl\.Missing' could not be imported"
    ):
        TRLEnvironment("tests.integrations.test_trl.Missing")
    env = TRLEnvironment(BadReward)
    with pytest.raises(TypeError, match=r"BadReward\.reset returned 3 \(int\); expected a string or None"):
        env.reset({"prompt": "1="}, seed=0)
    with pytest.raises(TypeError, match=r"BadReward\.get_reward returned = 'high'; expected a finite float"):
        env.finish()
    with pytest.raises(
        KeyError, match=r"the record has no column 'question' \(prompt_key\); its columns: \['prompt'\]"
    ):
        TRLEnvironment(SecretEnv, prompt_key="question").reset({"prompt": "1="}, seed=0)


def test_records_through_the_data_module_keep_their_columns(tiny_model_path):
    """reset(**row) sees every dataset column (TRL passes the row), not our internal prompt_ids."""
    seen = {}

    class Env(SecretEnv):
        def reset(self, **kwargs):
            seen.update(kwargs)
            return super().reset(**kwargs)

    data = PromptDataModule(
        source=Rows([{"prompt": "12=", "answer": "3", "level": 2}] * 2),
        tokenizer_path=str(tiny_model_path),
        batch_size=2,
    )
    data.setup()
    TRLEnvironment(Env).reset(data.train_records[0], seed=0)
    assert seen == {"prompt": "12=", "answer": "3", "level": 2}
    # With our chat template on, TRL's reset still sees the dataset's prompt and the opening is templated once.
    data = PromptDataModule(
        source=Rows([{"prompt": "12=", "answer": "3"}] * 2),
        tokenizer_path=str(tiny_model_path),
        batch_size=2,
        format=PromptFormat(use_chat_template=True),
    )
    data.setup()
    assert data.train_records[0]["prompt"] != "12="  # the record holds the rendered text
    opening = TRLEnvironment(Env).reset(data.train_records[0], seed=0)
    assert seen["prompt"] == "12=" and opening[0] == {"role": "user", "content": "12="}
