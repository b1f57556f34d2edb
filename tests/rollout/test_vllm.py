"""VLLMEngine on the shared session engine: weight refresh after optimizer steps, LoRA, sampling."""

from __future__ import annotations

import random

import pytest
import torch

from lightning_grpo.models.weights import policy_weights_for_engine
from lightning_grpo.rollout.base import Rollout, SamplingConfig, rollout_to_tensors
from tests.helpers.rollout import assert_eos_handling, max_logprob_gap

pytestmark = pytest.mark.vllm

EOS, PAD = 1, 0
TEMPERATURE = 0.8
#: A 200-token prefix shared by all prompts: longer than one KV block (128 tokens on CPU), so the
#: prefix cache holds attention K/V computed by the previous weights unless the push resets it.
SHARED = [random.Random(0).randrange(5, 48) for _ in range(200)]
LONG_PROMPTS = [SHARED + [5 + i] for i in range(4)]
SAMPLING = SamplingConfig(n=4, temperature=TEMPERATURE, max_new_tokens=8)
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).train()


def _lora_policy(path):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_load(path), LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=LORA_TARGETS))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:  # peft starts B at zero (a no-op adapter): make it matter
                param.copy_(torch.randn(param.shape, generator=gen) * 0.2)
    return model.train()


def _train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, rollout: Rollout) -> None:
    """One optimizer step on the sampled tokens' negative log-likelihood (moves every sampled log-prob)."""
    t = rollout_to_tensors(rollout, PAD)
    Lc = t.completion_mask.shape[1]
    position_ids = (t.attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=t.input_ids, attention_mask=t.attention_mask, position_ids=position_ids).logits
    logp = torch.log_softmax(logits[:, -Lc - 1 : -1] / TEMPERATURE, -1).gather(-1, t.input_ids[:, -Lc:, None])
    loss = -(logp.squeeze(-1) * t.completion_mask).sum() / t.completion_mask.sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def _refresh_gaps(engine, model, optimizer) -> tuple[float, float, float]:
    """Max |vLLM - HF| log-prob gap: right after a push, after step + push, and after step without push."""
    engine.load_weights(policy_weights_for_engine(model))
    first = engine.generate(LONG_PROMPTS, SAMPLING, seed=0)  # also fills the prefix cache
    synced_before = max_logprob_gap(model, first, TEMPERATURE)
    _train_step(model, optimizer, first)
    engine.load_weights(policy_weights_for_engine(model))
    second = engine.generate(LONG_PROMPTS, SAMPLING, seed=1)
    synced_after = max_logprob_gap(model, second, TEMPERATURE)
    _train_step(model, optimizer, second)  # no push: the engine is now one step stale
    stale = max_logprob_gap(model, engine.generate(LONG_PROMPTS, SAMPLING, seed=2), TEMPERATURE)
    return synced_before, synced_after, stale


@pytest.fixture(params=["inplace-plain", "inplace-packed", "reload"])
def push_mode(request, vllm_engine):
    """Run a test with each weight-push path of the shared engine (restored afterwards)."""
    previous = vllm_engine.weight_push, vllm_engine.cpu_gemm
    vllm_engine.weight_push, _, gemm = request.param.partition("-")
    vllm_engine.cpu_gemm, vllm_engine._inplace_push = gemm or "auto", None  # the plan is rebuilt
    yield request.param
    (vllm_engine.weight_push, vllm_engine.cpu_gemm), vllm_engine._inplace_push = previous, None


def test_weight_refresh_follows_optimizer_steps(vllm_engine, tiny_model_path, push_mode):
    model = _load(tiny_model_path)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    synced_before, synced_after, stale = _refresh_gaps(vllm_engine, model, optimizer)
    print(f"\nfull weights ({push_mode}): synced {synced_before:.2e} / {synced_after:.2e}, stale {stale:.3f}")
    assert synced_before <= 1e-4 and synced_after <= 1e-4
    assert stale > 0.1


def test_weight_refresh_follows_optimizer_steps_with_merged_lora(vllm_engine, tiny_model_path, push_mode):
    model = _lora_policy(tiny_model_path)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=2e-2)
    synced_before, synced_after, stale = _refresh_gaps(vllm_engine, model, optimizer)
    print(f"\nmerged LoRA ({push_mode}): synced {synced_before:.2e} / {synced_after:.2e}, stale {stale:.3f}")
    assert synced_before <= 1e-4 and synced_after <= 1e-4
    assert stale > 0.1


def test_lora_adapter_path_follows_saved_adapters(vllm_engine, tiny_model_path, tmp_path):
    model = _lora_policy(tiny_model_path)
    vllm_engine.load_weights(policy_weights_for_engine(model, merge_lora=False))  # base weights only
    try:
        model.save_pretrained(tmp_path / "v1")
        vllm_engine.load_lora_adapter(str(tmp_path / "v1"))
        first = vllm_engine.generate(LONG_PROMPTS, SAMPLING, seed=0)
        assert max_logprob_gap(model, first, TEMPERATURE) <= 1e-4
        _train_step(model, torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=2e-2), first)
        stale = max_logprob_gap(model, vllm_engine.generate(LONG_PROMPTS, SAMPLING, seed=1), TEMPERATURE)
        model.save_pretrained(tmp_path / "v2")
        vllm_engine.load_lora_adapter(str(tmp_path / "v2"))
        synced = max_logprob_gap(model, vllm_engine.generate(LONG_PROMPTS, SAMPLING, seed=1), TEMPERATURE)
        print(f"\nLoRA adapter path: synced {synced:.2e}, stale {stale:.3f}")
        assert synced <= 1e-4 and stale > 0.1
    finally:
        vllm_engine.unload_lora_adapter()
    with model.disable_adapter():  # unloaded: the engine samples from the base weights again
        assert max_logprob_gap(model, vllm_engine.generate(LONG_PROMPTS, SAMPLING, seed=2), TEMPERATURE) <= 1e-4


def test_inplace_push_covers_the_model_and_matches_reload(vllm_engine, tiny_model_path):
    from lightning_grpo.rollout.vllm_push import CpuInplacePush

    model = _load(tiny_model_path)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(1)) * 0.05)
    logprobs = {}
    for mode, gemm in (("reload", "auto"), ("inplace", "packed"), ("inplace", "plain")):
        vllm_engine.weight_push, vllm_engine.cpu_gemm, vllm_engine._inplace_push = mode, gemm, None
        vllm_engine.load_weights(policy_weights_for_engine(model))
        logprobs[gemm if mode == "inplace" else mode] = vllm_engine.generate(LONG_PROMPTS, SAMPLING, seed=3).logprobs
    vllm_engine.weight_push, vllm_engine.cpu_gemm, vllm_engine._inplace_push = "auto", "auto", None
    plan = vllm_engine._push_plan()
    assert isinstance(plan, CpuInplacePush) and plan.plain_gemm  # auto on CPU: in place, plain kernels at hidden 64
    for gemm, tol in (("packed", 1e-6), ("plain", 1e-5)):  # same kernels as reload; F.linear rounds differently
        gap = max(abs(a - b) for r, i in zip(logprobs["reload"], logprobs[gemm]) for a, b in zip(r, i))
        assert gap <= tol, (gemm, gap)
    with pytest.raises(KeyError, match=r"missing 1 tensor\(s\).*model.norm.weight"):
        vllm_engine.load_weights((n, t) for n, t in policy_weights_for_engine(model) if n != "model.norm.weight")


def test_group_samples_differ_and_the_seed_reproduces(vllm_engine, tiny_model_path):
    vllm_engine.load_weights(policy_weights_for_engine(_load(tiny_model_path)))
    prompts = [[5, 6, 7], [5, 6, 7], [10, 11, 12, 13]]  # a repeated prompt must not repeat its samples
    sampling = SamplingConfig(n=8, temperature=1.0, max_new_tokens=10)
    first = vllm_engine.generate(prompts, sampling, seed=11)
    groups = [first.completion_ids[p * 8 : (p + 1) * 8] for p in range(len(prompts))]
    for p, group in enumerate(groups):
        assert len({tuple(c) for c in group}) == 8, f"prompt {p}: samples of one group repeat"
    assert groups[0] != groups[1]
    again = vllm_engine.generate(prompts, sampling, seed=11)
    assert again.completion_ids == first.completion_ids and again.logprobs == first.logprobs
    assert vllm_engine.generate(prompts, sampling, seed=12).completion_ids != first.completion_ids


def test_stops_at_eos_and_reports_finished(vllm_engine, tiny_model_path):
    vllm_engine.load_weights(policy_weights_for_engine(_load(tiny_model_path)))
    sampling = SamplingConfig(n=8, max_new_tokens=16)
    rollout = vllm_engine.generate([[5, 6, 7, 8, 9], [10, 11], [12, 13, 14], [20]], sampling, seed=1)
    assert_eos_handling(rollout, EOS, sampling.max_new_tokens)  # both cases occur at this seed


def test_generate_leaves_the_global_rng_alone(vllm_engine):
    state = torch.random.get_rng_state()
    vllm_engine.generate([[5, 6, 7]], SamplingConfig(n=2, max_new_tokens=4), seed=0)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_rejects_prompts_longer_than_the_engine_allows(vllm_engine):
    with pytest.raises(ValueError, match=r"longest prompt \(500 tokens\) \+ max_new_tokens \(16\) exceeds .* \(512\)"):
        vllm_engine.generate([[5] * 500], SamplingConfig(n=1, max_new_tokens=16), seed=0)
