"""An exported LoRA adapter names a base that exists wherever the folder goes: the hub id when the policy came
from the hub, else the base written into the folder (``<folder>/base``, named ``<folder's name>/base``)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from lightning_grpo import LoraSettings
from lightning_grpo.models.export import hub_id_of, write_model_folder
from tests.helpers.export import sequence_logprobs


@pytest.fixture
def lora_policy(tiny_model_path):
    """The tiny model with a LoRA adapter that is not the identity (peft's random B), and lm_head trained
    in full (``modules_to_save``), as ``grpo_lora.yaml`` trains it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lightning_grpo.models.loading import apply_lora

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    lora = LoraSettings(r=4, alpha=8, init_lora_weights=False, extra={"modules_to_save": ["lm_head"]})
    policy = apply_lora(base, lora)
    with torch.no_grad():  # the fully trained module moved away from the base's
        policy.base_model.model.lm_head.modules_to_save["default"].weight.add_(0.5)
    return policy, AutoTokenizer.from_pretrained(tiny_model_path)


def test_a_local_base_travels_inside_the_adapter_folder(tmp_path, monkeypatch, lora_policy, tiny_model_path):
    """Written from a local base folder (the built-in tiny model's), then moved elsewhere: the adapter names
    ``my-adapter/base``, which holds the base as it was (not the trained lm_head), and base + adapter give the
    policy's log-probs."""
    from peft import AutoPeftModelForCausalLM
    from safetensors.torch import load_file

    policy, tokenizer = lora_policy
    write_model_folder(
        policy, tokenizer, tmp_path / "train-machine" / "my-adapter", adapter=True, base_model=str(tiny_model_path)
    )
    moved = tmp_path / "elsewhere"
    shutil.move(tmp_path / "train-machine", moved)
    shutil.rmtree(moved.parent / "train-machine", ignore_errors=True)
    config = json.loads((moved / "my-adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "my-adapter/base"
    written, original = (
        load_file(moved / "my-adapter" / "base" / "model.safetensors"),
        load_file(tiny_model_path / "model.safetensors"),
    )
    assert written.keys() == original.keys()
    for name, tensor in original.items():
        torch.testing.assert_close(written[name], tensor, atol=0, rtol=0)
    monkeypatch.chdir(moved)
    loaded = AutoPeftModelForCausalLM.from_pretrained("my-adapter", dtype=torch.float32)
    torch.testing.assert_close(
        sequence_logprobs(loaded, tokenizer), sequence_logprobs(policy, tokenizer), atol=1e-5, rtol=0
    )


def test_a_hub_base_is_named_by_its_id_and_not_copied(tmp_path, lora_policy):
    policy, tokenizer = lora_policy
    out = write_model_folder(policy, tokenizer, tmp_path / "a", adapter=True, base_model="Qwen/Qwen2.5-0.5B")
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == "Qwen/Qwen2.5-0.5B"
    assert not (out / "base").exists()


def test_a_save_during_training_names_a_local_base_by_its_path(tmp_path, lora_policy, tiny_model_path):
    """``carry_base=False`` (SavePretrained's adapter saves): the local base is named, not copied at every save."""
    policy, tokenizer = lora_policy
    out = write_model_folder(
        policy, tokenizer, tmp_path / "model", adapter=True, base_model=str(tiny_model_path), carry_base=False
    )
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == str(tiny_model_path)
    assert not (out / "base").exists()


def test_hub_ids_of_names_and_of_hub_cache_snapshots(tmp_path, tiny_model_path):
    snapshot = tmp_path / "hub" / "models--Qwen--Qwen2.5-0.5B-Instruct" / "snapshots" / "7ae557604adf"
    snapshot.mkdir(parents=True)
    assert hub_id_of("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert hub_id_of(str(snapshot)) == "Qwen/Qwen2.5-0.5B-Instruct"
    assert hub_id_of(str(tiny_model_path)) is None and hub_id_of("./my-model") is None and hub_id_of(None) is None
