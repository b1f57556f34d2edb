"""policy_weights_for_engine: HF checkpoint names, LoRA merged out of place."""

from __future__ import annotations

import copy

import pytest
import torch

from lightning_grpo.models.weights import policy_weights_for_engine

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _load(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def _lora(path, **config):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_load(path), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, **config))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name or "modules_to_save" in name or "lora_magnitude" in name:
                param.add_(torch.randn(param.shape, generator=gen) * 0.1)
    return model


def test_plain_model_yields_its_state_dict(tiny_model_path):
    model = _load(tiny_model_path)
    pairs = list(policy_weights_for_engine(model))
    state = model.state_dict()
    assert [name for name, _ in pairs] == list(state)
    for name, tensor in pairs:
        assert tensor.data_ptr() == state[name].data_ptr()  # the live tensor, no copy
        assert not tensor.requires_grad


@pytest.mark.parametrize(
    "config",
    [
        {"target_modules": TARGETS},
        {"target_modules": ["q_proj", "v_proj"], "modules_to_save": ["lm_head"]},
        {"target_modules": ["q_proj", "down_proj"], "use_dora": True},
    ],
    ids=["lora", "lora+modules_to_save", "dora"],
)
def test_peft_model_yields_what_merge_and_unload_gives(tiny_model_path, config):
    model = _lora(tiny_model_path, **config)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    pairs = dict(policy_weights_for_engine(model))
    expected = copy.deepcopy(model).merge_and_unload().state_dict()
    assert list(pairs) == list(expected)
    assert not any("lora" in n or "base_layer" in n or n.startswith("base_model") for n in pairs)
    for name, tensor in pairs.items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=1e-6, msg=name)
    original = _load(tiny_model_path).state_dict()
    changed = [n for n in pairs if not torch.equal(pairs[n], original[n])]
    assert changed, "the adapters should change some weights"
    for name, param in model.named_parameters():  # the peft model itself is untouched
        assert torch.equal(param, before[name]), name


def test_merge_lora_false_yields_the_base_weights(tiny_model_path):
    model = _lora(tiny_model_path, target_modules=TARGETS)
    base = _load(tiny_model_path).state_dict()
    pairs = dict(policy_weights_for_engine(model, merge_lora=False))
    assert list(pairs) == list(base)
    for name, tensor in pairs.items():
        assert torch.equal(tensor, base[name]), name


def test_already_merged_adapters_are_not_added_twice(tiny_model_path):
    model = _lora(tiny_model_path, target_modules=TARGETS)
    unmerged = {n: t.clone() for n, t in policy_weights_for_engine(model)}
    model.merge_adapter()
    for name, tensor in policy_weights_for_engine(model):
        torch.testing.assert_close(tensor, unmerged[name], rtol=0, atol=1e-6, msg=name)


def test_compiled_model_yields_the_inner_names(tiny_model_path):
    model = _load(tiny_model_path)
    compiled = torch.compile(model)  # wraps without compiling until called
    assert [name for name, _ in policy_weights_for_engine(compiled)] == list(model.state_dict())


def test_fsdp2_sharded_peft_model_yields_the_hf_names(tiny_model_path):
    """fully_shard swaps the policy's class for ``FSDP<cls>`` defined in torch's module: the peft model
    must still be unwrapped (it pushed ``base_model.model.*`` names, which vLLM refused; matrix cell
    fsdp2-vllm_server-lora-openenv-tensorboard)."""
    from torch.distributed.fsdp import FSDPModule

    model = _lora(tiny_model_path, target_modules=TARGETS)
    expected = [name for name, _ in policy_weights_for_engine(model)]
    cls = type(model)
    model.__class__ = type(
        f"FSDP{cls.__name__}", (FSDPModule, cls), {"__module__": "torch.distributed.fsdp._fully_shard._fsdp_init"}
    )
    assert [name for name, _ in policy_weights_for_engine(model)] == expected
