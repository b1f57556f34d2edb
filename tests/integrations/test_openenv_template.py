"""An OpenEnv environment exactly as ``openenv init`` writes it trains unchanged.

``tests/integrations/echo_env`` is the output of ``openenv init echo_env`` (openenv-core 0.3.0; its
Python files, unedited): ``class EchoEnvironment(Environment)`` without type parameters (the action
class is only in ``step``'s annotation) and ``reset(self)`` without ``seed``. A misconfigured
environment fails while the trainer is set up, before the engine starts."""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest

pytest.importorskip("openenv")  # the dev extra installs openenv-core

from openenv.core.env_server import Action, Environment, Observation, State

from lightning_grpo import GRPOModule, PromptDataModule
from lightning_grpo.data.tasks import DigitTask
from lightning_grpo.integrations.openenv import OpenEnvEnvironment
from tests.helpers.integrations import fit, openenv_callback, turn_texts

from .echo_env.models import EchoAction
from .echo_env.server.echo_env_environment import EchoEnvironment

TEMPLATE = "tests.integrations.echo_env.server.echo_env_environment.EchoEnvironment"


def _callback(**environment_args):
    return openenv_callback(max_turns=2, **environment_args)


def test_the_openenv_init_template_trains_unchanged():
    """Two steps; every episode's reward is the template's own (0.1 x the length of each echoed turn)."""
    from transformers import AutoTokenizer

    from lightning_grpo.models.tiny import tiny_model_dir

    env = OpenEnvEnvironment(TEMPLATE)
    assert env.action_cls is EchoAction and env.action_field == "message"  # from step's annotation
    logger, recorder = fit(_callback(env=TEMPLATE, prompt_key="prompt"), steps=2)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir())
    rewards = []
    for rollout, scored in zip(recorder.rollouts, recorder.scored):
        for i, ep in enumerate(rollout.episodes):
            assert ep.messages[0]["content"].endswith(
                '\n\n{"echoed_message": "Echo Env environment ready!", "message_length": 0}'
            )
            expected = sum(0.1 * len(text) for text in turn_texts(tok, ep))  # the template's step, replayed
            assert scored.rewards.rewards[i, 0].item() == pytest.approx(expected, abs=1e-6)
            rewards.append(expected)
    assert len(rewards) == 2 * 8 and max(rewards) > 0  # not vacuous: the echoed turns earned something


def test_reset_gets_only_the_arguments_it_accepts():
    """The template's reset(self) gets no seed (as OpenEnv's server filters by the signature); a
    reset_kwargs / reset_columns entry it cannot take is refused when the adapter is built."""
    env = OpenEnvEnvironment(EchoEnvironment, prompt_key="prompt")
    assert env.reset({"prompt": "12="}, seed=5)[0]["content"].startswith("12=\n\n")
    with pytest.raises(
        ValueError,
        match=r"OpenEnvEnvironment\.reset_kwargs: EchoEnvironment\.reset\(\) takes no argument "
        r"'level' \(it takes: nothing\)",
    ):
        OpenEnvEnvironment(EchoEnvironment, reset_kwargs={"level": 2})
    with pytest.raises(
        ValueError, match=r"OpenEnvEnvironment\.reset_columns: EchoEnvironment\.reset\(\) takes no argument 'answer'"
    ):
        OpenEnvEnvironment(EchoEnvironment, reset_columns=["answer"])


class UnknownAction(Environment):
    """Neither Environment[...] parameters nor an annotated step: the action class cannot be found."""

    def reset(self, seed: int | None = None, **kwargs: Any) -> Observation:
        return Observation()

    def step(self, action, **kwargs: Any) -> Observation:
        return Observation(done=True)

    @property
    def state(self) -> State:
        return State()


class Answer(Action):
    text: str


class Annotated(UnknownAction):
    def step(self, action: Answer, **kwargs: Any) -> Observation:
        return Observation(done=True)


def test_a_misconfigured_environment_fails_before_the_engine_starts():
    assert OpenEnvEnvironment(Annotated).action_cls is Answer
    callback = _callback(env="tests.integrations.test_openenv_template.UnknownAction")
    trainer = L.Trainer(
        max_steps=1,
        callbacks=[callback],
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    with pytest.raises(
        ValueError,
        match=r"OpenEnvEnvironment: the action class of UnknownAction is unknown \(no "
        r"Environment\[Action, \.\.\.\] parameters, no annotation on step's 'action'\)",
    ):
        trainer.fit(GRPOModule(model="tiny:chars"), datamodule=PromptDataModule(DigitTask(), batch_size=2))
    assert callback.engine is None  # nothing was sampled
