"""Seeded generation batches whose prompts add up to far more than 2,048 tokens, on CPU.

vLLM-CPU's defaults chunk such a batch's prefill, and a split prefill of a request with its own
seed crashes ("CPU Generator does not use offset"): the engines switch chunked prefill off on CPU
(lightning_grpo/rollout/prefill.py). These tests generate such batches in-process, on a server and
in multi-turn episodes, and check that every sample still has its own random stream: other seeds
give other samples, the same seed repeats, and a request samples the same whether it is generated
alone or inside the big batch.
"""

from __future__ import annotations

import random

import lightning as L
import pytest

from lightning_grpo import GRPOModule, PromptDataModule, RewardSpec, RolloutCallback, SamplingConfig
from lightning_grpo.agents.environment import Environment, Step
from lightning_grpo.agents.episodes import EpisodeLimits, run_episodes
from lightning_grpo.data.sources import Rows
from lightning_grpo.models.weights import policy_weights_for_engine
from lightning_grpo.rollout.base import RolloutEngine

pytestmark = pytest.mark.vllm

#: 4 prompts x G = 8 of 505 tokens: 16,160 prompt tokens in one call (the shape that crashed).
PROMPTS = [[random.Random(p).randrange(5, 40) for _ in range(505)] for p in range(4)]
SAMPLING = SamplingConfig(n=8, temperature=1.0, max_new_tokens=7)


@pytest.fixture
def fresh_weights(vllm_engine, tiny_model_path):
    """The shared engine holds the tiny model's initial weights (other tests push their own)."""
    from transformers import AutoModelForCausalLM

    vllm_engine.load_weights(policy_weights_for_engine(AutoModelForCausalLM.from_pretrained(tiny_model_path)))
    return vllm_engine


def assert_own_streams(engine: RolloutEngine, prompts: list[list[int]], sampling: SamplingConfig) -> None:
    """The long batch samples; each sample keeps its own random stream."""
    assert sum(len(p) for p in prompts) * sampling.n > 2048
    first = engine.generate(prompts, sampling, seed=11)
    assert len(first.completion_ids) == len(prompts) * sampling.n
    assert all(1 <= len(c) <= sampling.max_new_tokens for c in first.completion_ids)
    G = sampling.n
    for p in range(len(prompts)):  # the G samples of one request differ from each other
        assert len({tuple(c) for c in first.completion_ids[p * G : (p + 1) * G]}) > 1
    assert engine.generate(prompts, sampling, seed=11).completion_ids == first.completion_ids  # same seed repeats
    other = engine.generate(prompts, sampling, seed=12)
    assert all(a != b for a, b in zip(other.completion_ids, first.completion_ids))  # another seed, other samples
    alone = engine.generate(prompts[:1], sampling, seed=11)  # request 0 on its own: same stream as in the batch
    assert alone.completion_ids == first.completion_ids[:G]
    for a, b in zip(alone.logprobs, first.logprobs[:G]):
        assert a == pytest.approx(b, abs=1e-5)


def test_in_process_engine_never_chunks_a_seeded_prefill(fresh_weights):
    config = fresh_weights.llm.llm_engine.vllm_config
    assert not config.scheduler_config.enable_chunked_prefill
    assert config.scheduler_config.max_num_batched_tokens >= config.model_config.max_model_len
    assert_own_streams(fresh_weights, PROMPTS, SAMPLING)


def test_server_never_chunks_a_seeded_prefill(vllm_server):
    from lightning_grpo.rollout.server_client import ServerClient
    from lightning_grpo.rollout.server_engine import ServerEngine

    engine = ServerEngine([ServerClient(vllm_server)], pusher=False)
    assert_own_streams(engine, PROMPTS, SAMPLING)


class LongObservations(Environment):
    """Answers every turn with 200 characters of text: the contexts grow by ~204 tokens a turn, more
    than the prefix cache holds from the turn before, so each turn prefills thousands of new tokens."""

    def reset(self, record, seed):
        self.rng = random.Random(seed)
        return None

    def step(self, turn):
        return Step(messages="".join(self.rng.choice("abcdefgh ") for _ in range(200)), reward=len(turn.ids))


def test_multi_turn_contexts_grow_past_the_chunk_size(fresh_weights, tiny_model_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    records = [{"prompt_ids": [random.Random(100 + p).randrange(5, 40) for _ in range(40)]} for p in range(4)]
    sampling = SamplingConfig(n=4, temperature=1.0, max_new_tokens=4)
    limits = EpisodeLimits(max_turns=3, max_model_len=512)

    def episodes(seed):
        return run_episodes(fresh_weights, LongObservations, tokenizer, None, records, sampling, seed, limits)

    first = episodes(5)
    last_turn = [len(s.context) - len(s.ids) + s.turn_ids.index(2) for s in first.episodes]  # context before turn 2
    assert min(last_turn) >= 440 and sum(last_turn) > 2048 * 3  # 16 contexts of ~450 tokens
    assert all(s.turns == 3 for s in first.episodes)
    assert episodes(5).completion_ids == first.completion_ids
    assert all(a != b for a, b in zip(episodes(6).completion_ids, first.completion_ids))


def test_grpo_trains_three_steps_on_long_prompts(fresh_weights, tiny_model_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv(
        "LIGHTNING_GRPO_CACHE", str(tiny_model_path.parent)
    )  # GRPOModule() loads the session's tiny model
    rows = [
        {"prompt": "".join(random.Random(i).choice("0123456789") for _ in range(504)) + "=", "answer": str(i % 10)}
        for i in range(8)
    ]
    callback = RolloutCallback(
        engine="vllm", sampling=SamplingConfig(n=8, max_new_tokens=7), rewards=[RewardSpec("prefix_match")], seed=0
    )
    callback.use_engine(fresh_weights)  # built with VLLMEngine's defaults, like engine: vllm builds it
    module = GRPOModule(model="tiny:chars")
    L.seed_everything(0)
    trainer = L.Trainer(
        max_steps=3,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[callback],
    )
    trainer.fit(module, datamodule=PromptDataModule(source=Rows(rows), batch_size=4))
    assert trainer.global_step == 3
    assert module.rollout_batch.input_ids.shape == (32, 505 + 7)  # 4 prompts x 8 samples per step
    initial = dict(AutoModelForCausalLM.from_pretrained(tiny_model_path).named_parameters())
    assert any(not p.detach().equal(initial[n]) for n, p in module.policy.named_parameters())
