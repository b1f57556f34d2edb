"""HFEngine: transformers generate on the live policy."""

from __future__ import annotations

import random

import pytest
import torch

from lightning_grpo.rollout.base import SamplingConfig
from lightning_grpo.rollout.hf import HFEngine
from tests.helpers.rollout import assert_eos_handling, max_logprob_gap

EOS, PAD = 1, 0
PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14], [20]]  # different lengths: left padding is exercised


@pytest.fixture(scope="module")
def policy(tiny_model_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)


@pytest.fixture(scope="module")
def engine(policy):
    return HFEngine(policy, eos_token_id=EOS, pad_token_id=PAD)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_equal_a_teacher_forced_recomputation(engine, policy, temperature):
    rollout = engine.generate(PROMPTS, SamplingConfig(n=4, temperature=temperature, max_new_tokens=12), seed=0)
    gap = max_logprob_gap(policy, rollout, temperature)
    assert gap <= 1e-5, gap


def test_stops_at_eos_and_returns_nothing_after_it(engine):
    sampling = SamplingConfig(n=8, max_new_tokens=16)
    rollout = engine.generate(PROMPTS, sampling, seed=1)
    assert len(rollout.completion_ids) == len(PROMPTS) * 8 and rollout.group_size == 8
    assert_eos_handling(rollout, EOS, sampling.max_new_tokens)  # both cases occur at this seed


def test_group_samples_differ_and_the_seed_reproduces(engine):
    sampling = SamplingConfig(n=8, temperature=1.0, max_new_tokens=10)
    first = engine.generate(PROMPTS, sampling, seed=7)
    for p in range(len(PROMPTS)):
        group = {tuple(c) for c in first.completion_ids[p * 8 : (p + 1) * 8]}
        assert len(group) == 8, f"prompt {p}: only {len(group)} distinct samples out of 8"
    again = engine.generate(PROMPTS, sampling, seed=7)
    assert again.completion_ids == first.completion_ids and again.logprobs == first.logprobs
    other = engine.generate(PROMPTS, sampling, seed=8)
    assert other.completion_ids != first.completion_ids


def test_global_rng_untouched(engine):
    torch_state, py_state = torch.random.get_rng_state(), random.getstate()
    engine.generate(PROMPTS, SamplingConfig(n=2, max_new_tokens=4), seed=3)
    assert torch.equal(torch.random.get_rng_state(), torch_state)
    assert random.getstate() == py_state


@pytest.mark.parametrize("training", [True, False])
def test_generates_in_eval_mode_and_restores_the_mode(engine, policy, training):
    seen: list[bool] = []
    handle = policy.register_forward_pre_hook(lambda module, args: seen.append(module.training))
    policy.train(training)
    try:
        engine.generate(PROMPTS[:1], SamplingConfig(n=2, max_new_tokens=3), seed=0)
    finally:
        handle.remove()
    assert seen and not any(seen)
    assert policy.training is training
    assert all(m.training is training for m in policy.modules())


def test_peft_policy_logprobs_equal_a_recomputation(tiny_model_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5)
    model.train()
    rollout = HFEngine(model, EOS, PAD).generate(PROMPTS, SamplingConfig(n=2, max_new_tokens=8), seed=0)
    assert model.training  # restored after generate
    assert max_logprob_gap(model, rollout, 1.0) <= 1e-5


def test_rejects_bad_prompts(engine):
    with pytest.raises(ValueError, match=r"prompt_ids\[1\] must be a non-empty list of token ids"):
        engine.generate([[5], []], SamplingConfig(n=2), seed=0)


def test_greedy_decoding_is_deterministic_and_argmax(tiny_model_path):
    from transformers import AutoModelForCausalLM

    from lightning_grpo.rollout.base import SamplingConfig
    from lightning_grpo.rollout.hf import HFEngine

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    engine = HFEngine(model, eos_token_id=1, pad_token_id=0)
    cfg = SamplingConfig(n=3, temperature=0.0, max_new_tokens=4)
    a = engine.generate([[9, 13, 7, 6, 15]], cfg, seed=0)
    b = engine.generate([[9, 13, 7, 6, 15]], cfg, seed=123)
    assert a.completion_ids == b.completion_ids and len({tuple(c) for c in a.completion_ids}) == 1
    with torch.no_grad():
        first = model(torch.tensor([[9, 13, 7, 6, 15]])).logits[0, -1]
    assert a.completion_ids[0][0] == int(first.argmax())
