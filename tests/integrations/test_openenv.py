"""OpenEnv environments trained unchanged: in-process and over OpenEnv's own server and client.

Each run trains 20 GRPO steps on the tiny model; every episode is then replayed by calling the
environment directly (its own reset / step on the same seed and the same sampled turns), and the
rewards the trainer scored and logged must be exactly those."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

pytest.importorskip("openenv")  # the dev extra installs openenv-core

from lightning_grpo import SamplingConfig
from lightning_grpo.agents import AgentRolloutCallback, AgentSettings
from lightning_grpo.agents.environment import Turn
from lightning_grpo.integrations.openenv import OpenEnvClientEnvironment, OpenEnvEnvironment
from tests.helpers.integrations import fit, openenv_callback, turn_texts

from .openenv_envs import DigitGuessEnv, GuessAction, NumberEnv

ENVS = "tests.integrations.openenv_envs"
ROOT = Path(__file__).resolve().parents[2]


def direct_reward(seed: int, texts: list[str]) -> float:
    """The episode replayed on the environment itself: its rewards summed until it says done."""
    env, total = DigitGuessEnv(), 0.0
    env.reset(seed=seed)
    for text in texts:
        obs = env.step(GuessAction(guess=text))
        total += obs.reward or 0.0
        if obs.done:
            break
    return total


def check_rewards_equal_direct(logger, recorder, tokenizer_dir=None):
    from transformers import AutoTokenizer

    from lightning_grpo.models.tiny import tiny_model_dir

    tok = AutoTokenizer.from_pretrained(tokenizer_dir or tiny_model_dir())
    assert len(recorder.rollouts) == len(recorder.scored) == 20  # one generation per step
    logged = logger.series("train/reward/env_reward/mean")
    assert len(logged) == 20
    every, turns = [], []
    for rollout, scored, mean in zip(recorder.rollouts, recorder.scored, logged):
        turns += [ep.turns for ep in rollout.episodes]
        direct = torch.tensor([direct_reward(ep.env.seed, turn_texts(tok, ep)) for ep in rollout.episodes])  # [B]
        assert torch.equal(scored.rewards.rewards[:, 0], direct.float())  # what the trainer turned into advantages
        assert mean == pytest.approx(direct.mean().item(), abs=1e-6)  # what it logged
        every += direct.tolist()
    assert len(set(every)) >= 3 and set(turns) == {1, 2, 3}  # the comparison is not vacuous: multi-turn, varied rewards


def _callback(**environment_args):
    return openenv_callback(max_turns=3, **environment_args)


def test_in_process_environment_trains_with_its_own_rewards():
    callback = _callback(env=f"{ENVS}.DigitGuessEnv", prompt_key="prompt")
    logger, recorder = fit(callback, steps=20)
    check_rewards_equal_direct(logger, recorder)
    episode = recorder.rollouts[-1].episodes[0]
    assert episode.messages[0] == {"role": "user", "content": episode.messages[0]["content"]}
    assert episode.messages[0]["content"].endswith(
        "=\n\nguess a digit"
    )  # the record's prompt, then the reset observation


@pytest.fixture(scope="module")
def server_url(tmp_path_factory):
    """DigitGuessEnv served by OpenEnv (create_app + uvicorn) in a child process on loopback."""
    from lightning_grpo.rollout.server_process import free_port

    port = free_port()
    log_path = tmp_path_factory.mktemp("openenv-server") / "server.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with open(log_path, "w") as log:  # the server writes to its own copy of the file descriptor
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "--factory",
                f"{ENVS}:make_app",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=log,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2).read()
                break
            except OSError as err:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the OpenEnv server did not start: {log_path.read_text()[-2000:]}") from err
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_served_environment_trains_through_openenv_client(server_url):
    """The same environment behind OpenEnv's server: each episode is a WebSocket session of OpenEnv's
    GenericEnvClient; the rewards are those of the environment called in-process."""
    callback = AgentRolloutCallback(
        agent=AgentSettings(
            environment="lightning_grpo.integrations.openenv.OpenEnvClientEnvironment",
            environment_args={"base_url": server_url, "action_field": "guess", "prompt_key": "prompt"},
            max_turns=3,
        ),
        engine="hf",
        sampling=SamplingConfig(n=4, max_new_tokens=3),
        seed=0,
    )
    logger, recorder = fit(callback, steps=20)
    check_rewards_equal_direct(logger, recorder)
    assert all(ep.env.client is None for ep in recorder.rollouts[-1].episodes)  # every session closed in finish()


def test_typed_client_and_session_capacity(server_url):
    """A typed EnvClient: the action class comes from its generic parameters; an episode beyond the
    server's max_concurrent_envs gets one error that says how to raise it."""
    from openenv.core import EnvClient
    from openenv.core.client_types import StepResult

    from .openenv_envs import GuessObservation

    class GuessClient(EnvClient[GuessAction, GuessObservation, dict]):
        def _step_payload(self, action):
            return action.model_dump()

        def _parse_result(self, payload):
            obs = GuessObservation(
                **payload["observation"], reward=payload.get("reward"), done=payload.get("done", False)
            )
            return StepResult(observation=obs, reward=payload.get("reward"), done=payload.get("done", False))

        def _parse_state(self, payload):
            return payload

    envs = [OpenEnvClientEnvironment(server_url, client=GuessClient) for _ in range(17)]
    assert envs[0].action_cls is GuessAction and envs[0].action_field == "guess"
    try:
        for i, env in enumerate(envs[:16]):
            assert env.reset({}, seed=i) == [{"role": "user", "content": "guess a digit"}]
        target = DigitGuessEnv()
        target.reset(seed=3)
        step = envs[3].step(Turn(ids=[], text=str(target.target), index=0, finished=True))
        assert (step.reward, step.done, step.messages) == (1.0, True, [{"role": "user", "content": "right"}])
        with pytest.raises(ConnectionError, match=r"no session at http://127\.0\.0\.1:\d+ .*max_concurrent_envs=N"):
            envs[16].reset({}, seed=16)
    finally:
        for env in envs:
            env.finish()


def test_opening_uses_the_prompt_before_the_chat_template():
    """Records of a chat-templated data module hold the rendered prompt; the opening message carries the
    data's own prompt (text, or its chat messages) so the template is applied once."""
    env = OpenEnvEnvironment(NumberEnv, prompt_key="prompt")
    rendered = {"prompt": "<|im_start|>user\n12=<|im_end|>\n", "raw_prompt": "12=", "prompt_ids": [1, 2]}
    assert env.reset(rendered, seed=0) == [{"role": "user", "content": '12=\n\n{"value": 0, "note": "start"}'}]
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "12="}]
    assert env.reset({**rendered, "raw_prompt": messages}, seed=0) == messages + [
        {"role": "user", "content": '{"value": 0, "note": "start"}'}
    ]


# ------------------------------------------------------------------------------ bad input
def test_action_that_does_not_parse():
    """NumberAction.number is an int: text that is not a number is answered with an error message (and
    counted), or stops the run with invalid_action="raise"."""
    env = OpenEnvEnvironment(f"{ENVS}.NumberEnv", reset_columns=["level"], reset_kwargs={"mode": "x"})
    assert env.action_field == "number"
    assert env.reset({"level": 2, "prompt": "p"}, seed=1) == [
        {"role": "user", "content": '{"value": 0, "note": "start"}'}
    ]
    assert env.env.kwargs == {"mode": "x", "level": 2}
    step = env.step(Turn(ids=[], text="abc", index=0, finished=True))
    assert step.reward == 0.0 and not step.done
    assert step.messages[0]["content"].startswith("error: invalid action: 1 validation error for NumberAction")
    assert env.metrics() == {"invalid_actions": 1.0}
    step = env.step(Turn(ids=[], text="7", index=1, finished=True))
    assert (step.reward, step.done) == (7.0, True)
    strict = OpenEnvEnvironment(NumberEnv, invalid_action="raise")
    strict.reset({}, seed=0)
    with pytest.raises(
        ValueError,
        match=r"OpenEnvEnvironment: the model's turn 'abc' is not a valid action: 1 validation error for NumberAction",
    ):
        strict.step(Turn(ids=[], text="abc", index=0, finished=True))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"env": "tests.integrations.openenv_envs.Nope"},
            ValueError,
            r"OpenEnvEnvironment\.env 'tests\.integrations\.openenv_envs\.Nope' could not be imported",
        ),
        ({"env": "DigitGuessEnv"}, ValueError, r"OpenEnvEnvironment\.env 'DigitGuessEnv' is not an import path"),
        ({"env": dict}, TypeError, r"OpenEnvEnvironment\.env built a dict, not an openenv Environment"),
        (
            {"env": DigitGuessEnv, "action_field": "word"},
            ValueError,
            r"action_field 'word' is not a field of GuessAction; fields: \['guess', 'metadata'\]",
        ),
        (
            {"env": DigitGuessEnv, "invalid_action": "ignore"},
            ValueError,
            r"invalid_action must be 'message' or 'raise', got 'ignore'",
        ),
        (
            {"env": DigitGuessEnv, "action_from_text": "tests.integrations.openenv_envs.missing"},
            ValueError,
            r"action_from_text .* could not be imported",
        ),
    ],
)
def test_bad_in_process_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        OpenEnvEnvironment(**kwargs)


def test_bad_client_arguments_and_records():
    with pytest.raises(
        ValueError, match=r"base_url must be an http\(s\):// or ws\(s\):// URL, got '127\.0\.0\.1:8000'"
    ):
        OpenEnvClientEnvironment("127.0.0.1:8000", action_field="guess")
    with pytest.raises(TypeError, match=r"client must be an openenv EnvClient subclass"):
        OpenEnvClientEnvironment(
            "http://127.0.0.1:1", client="tests.integrations.openenv_envs.DigitGuessEnv", action_field="guess"
        )
    with pytest.raises(
        ValueError,
        match=r"the action class is unknown; set action \(its import path\), action_field, or action_from_text",
    ):
        OpenEnvClientEnvironment("http://127.0.0.1:1")
    env = OpenEnvEnvironment(DigitGuessEnv, prompt_key="question")
    with pytest.raises(KeyError, match=r"the record has no column 'question'; its columns: \['answer', 'prompt'\]"):
        env.reset({"prompt": "1234=", "answer": "5"}, seed=0)


def test_missing_openenv_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "openenv.core.env_server", None)
    with pytest.raises(ImportError, match=r"pip install 'lightning-grpo\[openenv\]'"):
        OpenEnvEnvironment(DigitGuessEnv)
