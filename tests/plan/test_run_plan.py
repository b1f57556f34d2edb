"""The run plan's numbers: the context length rule on hand-computed shapes, the batch geometry built once with its
limits, and the run seed followed by the data's prompt order and the sampling."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import lightning as L
import pytest

from lightning_grpo import (
    AgentRolloutCallback,
    AgentSettings,
    AlgorithmSettings,
    GRPOModule,
    PromptDataModule,
    RewardSpec,
    RolloutCallback,
    Rows,
    SamplingConfig,
    ServerSettings,
    VLLMArgs,
)
from lightning_grpo.data.records import PromptFormat
from lightning_grpo.plan.run_plan import RunPlan, context_length
from lightning_grpo.rollout.base import RolloutEngine
from lightning_grpo.rollout.engine_settings import EngineSettings
from lightning_grpo.rollout.hf import HFEngine

pytestmark = pytest.mark.usefixtures("tiny_cache")

#: Prompts of 3, 5 and 8 tokens (the tiny chars tokenizer reads one token per character): the train split's
#: longest is 5, the validation split's 8.
TRAIN = [{"prompt": "12=", "answer": "3"}, {"prompt": "4821=", "answer": "2"}]
VAL = [{"prompt": "1234567=", "answer": "8"}]


def _data(max_prompt_length: int | None = None, val: list | None = VAL, **kwargs) -> PromptDataModule:
    data = PromptDataModule(
        Rows(TRAIN, val=val),
        tokenizer_path="tiny:chars",
        batch_size=2,
        format=PromptFormat(max_prompt_length=max_prompt_length),
        **kwargs,
    )
    data.setup("fit")
    return data


def _rollout(engine: EngineSettings | str = "vllm", new: int = 4, **kwargs) -> RolloutCallback:
    return RolloutCallback(
        engine=engine, sampling=SamplingConfig(n=2, max_new_tokens=new), rewards=[RewardSpec("prefix_match")], **kwargs
    )


class _Engine(RolloutEngine):
    """An engine handed over with use_engine: only its length limit matters here."""

    def __init__(self, max_model_len: int | None) -> None:
        self.max_model_len = max_model_len

    def generate(self, prompt_ids, sampling, seed):
        raise NotImplementedError("not sampled in these tests")

    def load_weights(self, weights, version=None):
        raise NotImplementedError("not pushed in these tests")


# ------------------------------------------------------------------------------- context length
def test_context_length_is_the_longest_prompt_of_every_split_plus_max_new_tokens():
    module = GRPOModule(model="tiny:chars")
    assert context_length(module, _data(), _rollout(new=4).plan_side()) == 8 + 4  # the validation prompt is longest
    assert context_length(module, _data(val=None), _rollout(new=4).plan_side()) == 5 + 4
    server = _rollout("vllm_server", new=6).plan_side()
    assert context_length(module, _data(val=None), server) == 5 + 6


def test_context_length_takes_the_prompt_limit_when_one_is_set():
    module = GRPOModule(model="tiny:chars")
    assert context_length(module, _data(max_prompt_length=20), _rollout(new=4).plan_side()) == 20 + 4


def test_context_length_of_episodes_adds_the_episode_budget_and_a_last_turn():
    module, data = GRPOModule(model="tiny:chars"), _data(val=None)
    agents = AgentRolloutCallback(
        agent=AgentSettings(max_turns=3, max_episode_tokens=30), engine="vllm", sampling=SamplingConfig(n=2)
    )
    assert context_length(module, data, agents.plan_side()) == 5 + 30 + agents.sampling.max_new_tokens
    one_turn = AgentRolloutCallback(
        agent=AgentSettings(max_turns=1), engine="vllm", sampling=SamplingConfig(n=2, max_new_tokens=7)
    )
    assert context_length(module, data, one_turn.plan_side()) == 5 + 7
    unbounded = AgentRolloutCallback(agent=AgentSettings(max_turns=3), engine="vllm", sampling=SamplingConfig(n=2))
    with pytest.raises(
        ValueError, match=r"^rollout.engine.init_args.max_model_len is not set, and rollout.agent.max_episode_tokens"
    ):
        context_length(module, data, unbounded.plan_side())


def test_a_set_context_length_is_kept_and_checked():
    module, data = GRPOModule(model="tiny:chars"), _data()
    assert context_length(module, data, _rollout(VLLMArgs(max_model_len=64), new=4).plan_side()) == 64
    assert context_length(module, data, _rollout(VLLMArgs(max_model_len=12), new=4).plan_side()) == 12
    with pytest.raises(
        ValueError, match=r"^rollout.engine.init_args.max_model_len=11 is smaller than the longest prompt \(8"
    ):
        context_length(module, data, _rollout(ServerSettings(max_model_len=11), new=4).plan_side())


def test_the_live_policy_and_a_handed_over_engine_keep_their_own_limit():
    module, data = GRPOModule(model="tiny:chars"), _data()
    assert context_length(module, data, _rollout("hf", new=4).plan_side()) is None  # max_position_embeddings 512
    callback = _rollout(new=4)
    callback.use_engine(_Engine(max_model_len=40))
    assert context_length(module, data, callback.plan_side()) == 40
    callback.use_engine(_Engine(max_model_len=10))
    with pytest.raises(ValueError, match=r"^the engine's max_model_len=10 is smaller than the longest prompt \(8"):
        context_length(module, data, callback.plan_side())
    callback.use_engine(_Engine(max_model_len=None))
    assert context_length(module, data, callback.plan_side()) is None


# ------------------------------------------------------------------------------------- the plan
def _trainer(**kwargs) -> L.Trainer:
    return L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False, **kwargs)


def test_resolve_keeps_the_engine_settings_as_set(monkeypatch):
    monkeypatch.setattr("lightning_grpo.plan.engine_rules.vllm_installed", lambda: True)  # no engine is built
    rollout = _rollout(VLLMArgs(kv_cache_memory_bytes=64 * 1024**2), new=4)
    plan = RunPlan.resolve(_trainer(), GRPOModule(model="tiny:chars"), _data(), rollout.plan_side())
    assert plan.context_length == 12 and plan.engine_settings is rollout.engine_settings
    assert plan.engine_settings.max_model_len is None  # one home for the context length: the plan
    hf = RunPlan.resolve(_trainer(), GRPOModule(model="tiny:chars"), _data(), _rollout("hf").plan_side())
    assert hf.context_length is None and hf.engine_settings.name == "hf"


@dataclass
class _Recorded(EngineSettings):
    """Settings of an engine with its own context limit that record what they are built with (the engine itself
    samples the live policy with transformers)."""

    name: ClassVar[str] = "recorded"
    built: list = field(default_factory=list)
    """(max_model_len, sequences) of every build."""

    def build(self, module: Any, tokenizer: Any, seed: int, context: Any, *, max_model_len, sequences) -> HFEngine:
        self.built.append((max_model_len, sequences))
        return HFEngine(module.policy, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)


def test_the_engine_is_built_with_the_plans_context_length():
    """The longest prompt (8, validation) + max_new_tokens 4 = 12; 2 prompts x n=2 = 4 sequences per generation."""
    settings = _Recorded()
    rollout = _rollout(settings, new=4)
    trainer = _trainer(max_steps=1, callbacks=[rollout], limit_val_batches=0)
    trainer.fit(GRPOModule(model="tiny:chars"), datamodule=_data())
    assert rollout.plan.context_length == 12
    assert settings.built == [(12, 4)]


def test_the_geometry_is_built_once_from_every_side():
    """2 prompts x 8 completions = 16 rows; 2 steps per generation, accumulate 2, 3 iterations:
    6 optimizer steps and 12 training steps per generation."""
    module = GRPOModule(model="tiny:chars", algorithm=AlgorithmSettings(steps_per_generation=2, num_iterations=3))
    rollout = RolloutCallback(engine="hf", sampling=SamplingConfig(n=8, max_new_tokens=2))
    plan = RunPlan.resolve(_trainer(accumulate_grad_batches=2), module, _data(), rollout.plan_side())
    geometry = plan.geometry
    assert (geometry.prompts, geometry.group_size, geometry.rows) == (2, 8, 16)
    assert (geometry.optimizer_steps, geometry.training_steps, geometry.generation(13)) == (6, 12, 2)


def test_the_geometry_limits_are_checked_when_it_is_built():
    module = GRPOModule(model="tiny:chars", algorithm=AlgorithmSettings(steps_per_generation=3))
    rollout = RolloutCallback(engine="hf", sampling=SamplingConfig(n=2, max_new_tokens=2))
    with pytest.raises(
        ValueError,
        match=r"^model.algorithm.steps_per_generation=3 x trainer.accumulate_grad_batches=2 training steps share each "
        r"generation batch of data.batch_size=2 x rollout.sampling.n=2 = 4 completions: .*make their product <= 4$",
    ):
        RunPlan.resolve(_trainer(accumulate_grad_batches=2), module, _data(), rollout.plan_side())
    single = RolloutCallback(engine="hf", sampling=SamplingConfig(n=1, max_new_tokens=2))
    with pytest.raises(ValueError, match=r"^rollout.sampling.n=1 leaves 1 completion per prompt"):
        RunPlan.resolve(_trainer(), GRPOModule(model="tiny:chars"), _data(), single.plan_side())


def test_setup_hands_the_one_geometry_to_the_module_and_the_data():
    module = GRPOModule(model="tiny:chars", algorithm=AlgorithmSettings(steps_per_generation=2))
    data = _data()
    rollout = RolloutCallback(engine="hf", sampling=SamplingConfig(n=4, max_new_tokens=2))
    trainer = _trainer(max_steps=2, accumulate_grad_batches=2, callbacks=[rollout], limit_val_batches=0)
    trainer.fit(module, datamodule=data)
    assert module.geometry is rollout.plan.geometry
    assert module.geometry.training_steps == 4 and len(data.train_dataloader().dataset) == 4  # 1 generation x 4


# ----------------------------------------------------------------------------------------- seeds
def _order(data: PromptDataModule, generations: int = 6) -> list[str]:
    return [r["prompt"] for g in range(generations) for r in data.generation_prompts(g)]


def _digit_data(**kwargs) -> PromptDataModule:
    rows = [{"prompt": f"{i:04d}=", "answer": str(i % 10)} for i in range(40)]
    data = PromptDataModule(Rows(rows), tokenizer_path="tiny:chars", batch_size=4, **kwargs)
    data.setup("fit")
    return data


def test_the_prompt_order_follows_the_run_seed(monkeypatch):
    orders = {}
    for seed in (1, 2, 1):
        monkeypatch.setenv("PL_GLOBAL_SEED", str(seed))
        orders.setdefault(seed, []).append(_order(_digit_data()))
    assert orders[1][0] == orders[1][1]  # the same seed, the same order
    assert orders[1][0] != orders[2][0]  # another seed, another order
    monkeypatch.setenv("PL_GLOBAL_SEED", "2")
    assert _order(_digit_data(seed=1)) == orders[1][0]  # data.seed pins it whatever the run seed
    monkeypatch.delenv("PL_GLOBAL_SEED")
    assert _order(_digit_data()) == _order(_digit_data(seed=0))  # no run seed: 0


def test_the_sampling_seed_follows_the_run_seed_unless_pinned(monkeypatch):
    monkeypatch.setenv("PL_GLOBAL_SEED", "5")
    module, data = GRPOModule(model="tiny:chars"), _data()
    plan = RunPlan.resolve(_trainer(), module, data, _rollout("hf").plan_side())
    assert (plan.seed, plan.sampling_seed) == (5, 5)
    pinned = RunPlan.resolve(_trainer(), module, data, _rollout("hf", seed=9).plan_side())
    assert (pinned.seed, pinned.sampling_seed) == (5, 9)
    assert plan.tokenizer_source == data.tokenizer_source
