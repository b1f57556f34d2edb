"""A group is one task: the G episodes of a record share the environment's reset seed by default;
with ``reset_seed: episode`` each episode is trained (and logged) on its own opening, and a group
baseline across different tasks is refused unless ``allow_mixed_task_groups`` chooses it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import lightning as L
import pytest
from lightning.pytorch.loggers import CSVLogger

from lightning_grpo import AlgorithmSettings, GRPOModule, PromptDataModule, SamplingConfig
from lightning_grpo.agents import AgentRolloutCallback, AgentSettings
from lightning_grpo.agents.chat import ChatRenderer
from lightning_grpo.agents.environment import Environment, Step
from lightning_grpo.agents.episodes import EpisodeLimits, run_episodes
from lightning_grpo.callbacks.completions import CompletionLogSettings
from lightning_grpo.data.tasks import DigitTask
from tests.helpers.agents import BatchCatcher, ScriptedEngine, ids_of, tools_tokenizer

MODEL = "tiny:tools"  # the built-in tiny model with the chat-template tokenizer


class SeedOpening(Environment):
    """The opening depends on the reset seed (as a task drawn from it would): "<seed mod 1000>=", so
    the openings of different seeds differ in their tokens and in their length."""

    def reset(self, record, seed):
        self.seed = seed
        return [{"role": "user", "content": f"{seed % 1000}="}]

    def step(self, turn):
        return Step(
            messages=[{"role": "user", "content": "again"}], reward=float(turn.text[:1].isdigit()), done=turn.index == 1
        )


class Counter(Environment):
    """An opening that ignores the seed (a different one per object): not one task per group."""

    made = 0

    def reset(self, record, seed):
        Counter.made += 1
        return [{"role": "user", "content": f"{Counter.made}="}]

    def step(self, turn):
        return Step(done=True)


def _episodes(env, **kwargs):
    tok = tools_tokenizer()
    engine = ScriptedEngine(lambda call, row, prompt: ids_of(tok, "7"), eos_id=tok.eos_token_id)
    records = [{"prompt": "a", "prompt_ids": [5]}, {"prompt": "b", "prompt_ids": [6]}]
    return run_episodes(
        engine,
        env,
        tok,
        ChatRenderer(tok, []),
        records,
        SamplingConfig(n=4, max_new_tokens=1),
        seed=3,
        limits=EpisodeLimits(max_turns=2),
        **kwargs,
    )


def test_a_group_shares_its_reset_seed_and_opening_by_default():
    out = _episodes(SeedOpening)
    seeds = [ep.env.seed for ep in out.episodes]
    assert seeds[:4] == [seeds[0]] * 4 and seeds[4:] == [seeds[4]] * 4 and seeds[0] != seeds[4]
    openings = [ep.context[: ep.prompt_length] for ep in out.episodes]  # [8] token lists
    assert openings[:4] == [out.prompt_ids[0]] * 4 and openings[4:] == [out.prompt_ids[1]] * 4
    assert out.prompt_ids[0] != out.prompt_ids[1]


def test_per_episode_seeds_keep_each_episodes_opening():
    out = _episodes(SeedOpening, reset_seed="episode")
    assert len({ep.env.seed for ep in out.episodes}) == 8
    assert [out.prompt_of(i) for i in range(8)] == [ep.context[: ep.prompt_length] for ep in out.episodes]
    assert len({tuple(out.prompt_of(i)) for i in range(4)}) > 1  # not vacuous: the group's openings differ


def test_a_group_whose_openings_differ_is_refused():
    with pytest.raises(
        ValueError,
        match=r"Counter\.reset gave the episodes of record 0 different openings.*"
        r"rollout\.agent\.reset_seed: episode.*rollout\.agent\.allow_mixed_task_groups: true",
    ):
        _episodes(Counter)


class RandomOpening:
    """Written for TRL (reset(**row), no seed): the opening is drawn at random, not from the row."""

    def reset(self, **row):
        return f" {random.randrange(1000)}"


def test_a_trl_environment_with_a_random_opening():
    """Refused by default (named by its own class); with per-episode seeds each row keeps its own opening."""
    from lightning_grpo.integrations.trl import TRLEnvironment

    random.seed(0)
    with pytest.raises(ValueError, match=r"RandomOpening\.reset gave the episodes of record 0 different openings"):
        _episodes(lambda: TRLEnvironment(RandomOpening))
    out = _episodes(lambda: TRLEnvironment(RandomOpening), reset_seed="episode")
    assert [out.prompt_of(i) for i in range(8)] == [ep.context[: ep.prompt_length] for ep in out.episodes]
    assert len({tuple(out.prompt_of(i)) for i in range(8)}) > 1


def test_mixed_task_groups_are_refused_before_the_engine_starts():
    with pytest.raises(
        ValueError,
        match=r"rollout\.agent\.reset_seed: episode gives the 4 episodes of a group different reset "
        r"seeds.*set rollout\.agent\.allow_mixed_task_groups: true.*docs/guide/agents\.md",
    ):
        AgentRolloutCallback(agent=AgentSettings(reset_seed="episode"), engine="hf", sampling=SamplingConfig(n=4))
    with pytest.raises(ValueError, match=r"rollout\.agent\.reset_seed must be 'group' or 'episode', got 'row'"):
        AgentRolloutCallback(agent=AgentSettings(reset_seed="row"), engine="hf")
    AgentRolloutCallback(
        agent=AgentSettings(reset_seed="episode"), engine="hf", sampling=SamplingConfig(n=1)
    )  # no group, nothing mixed
    AgentRolloutCallback(
        agent=AgentSettings(reset_seed="episode", allow_mixed_task_groups=True),
        engine="hf",
        sampling=SamplingConfig(n=4),
    )


def test_each_episode_trains_and_is_logged_on_its_own_opening(tmp_path):
    """Per-episode seeds: the trainer's log-probs of the sampled tokens (recomputed on each episode's
    own opening) equal the engine's, and each completions.jsonl row shows its own episode's opening.
    (Training every episode on its group's first opening put them 0.124 apart.)"""
    catcher = BatchCatcher()
    callback = AgentRolloutCallback(
        agent=AgentSettings(
            environment="tests.agents.test_group_seeds.SeedOpening",
            max_turns=2,
            reset_seed="episode",
            allow_mixed_task_groups=True,
        ),
        engine="hf",
        seed=0,
        sampling=SamplingConfig(n=4, max_new_tokens=3),
        log_completions=CompletionLogSettings(every_n_steps=1, groups=None),
    )
    episodes, run = [], callback.run

    def recording_run(*args, **kwargs):
        out = run(*args, **kwargs)
        episodes.append(out.episodes)
        return out

    callback.run = recording_run
    trainer = L.Trainer(
        max_steps=1,
        callbacks=[callback, catcher],
        accelerator="cpu",
        logger=CSVLogger(tmp_path),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(
        GRPOModule(model=MODEL, algorithm=AlgorithmSettings(num_iterations=2)),
        datamodule=PromptDataModule(DigitTask(), tokenizer_path=MODEL, batch_size=2),
    )
    batch, eps = catcher.batches[0], episodes[0]  # 8 episodes
    openings = [ep.context[: ep.prompt_length] for ep in eps]
    assert len({tuple(o) for o in openings[:4]}) > 1 and len({len(o) for o in openings}) > 1  # not vacuous
    mask = batch.completion_mask  # [8, Lc]
    gap = ((batch.old_logp - batch.rollout_logp).abs() * mask).max().item()
    assert gap <= 1e-4, gap
    tok = trainer.datamodule.tokenizer
    rows = [json.loads(line) for line in (Path(trainer.log_dir) / "completions.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in rows] == [tok.decode(o, skip_special_tokens=False) for o in openings]
    assert all(
        r["prompt"].endswith(f"{ep.env.seed % 1000}=<|im_end|>\n<|im_start|>assistant\n") for r, ep in zip(rows, eps)
    )
