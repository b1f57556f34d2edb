"""A QLoRA run (4-bit base, LoRA adapter) exports as a dense merged model folder: its weights are the
dequantised base plus the merged adapter, its config carries no ``quantization_config``, and the same
folder is what the vLLM engine factory writes for the live policy (one save function)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("bitsandbytes")  # the qlora extra, part of dev

from lightning_grpo.models.export import export
from tests.helpers.export import sequence_logprobs, vllm_reads, vllm_serves_the_policy
from tests.helpers.runs import train_recipe

pytestmark = pytest.mark.usefixtures("tiny_cache")


@pytest.mark.vllm
@pytest.mark.slow
def test_qlora_run_exports_a_dense_folder_that_serves_the_runs_accuracy(tmp_path, vllm_engine, digit_teacher_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from lightning_grpo.rollout.model_dir import _save_for_engine

    # the QLoRA quickstart on the digit teacher (a policy that knows the task, quantised to nf4)
    built, run_dir = train_recipe(
        tmp_path, "qlora_quickstart.yaml", 4, engine=vllm_engine, extra=[f"--model.model={digit_teacher_path}"]
    )
    policy, tokenizer = built.model.policy, built.datamodule.tokenizer
    assert type(policy.base_model.model.model.layers[0].mlp.up_proj.base_layer).__name__ == "Linear4bit"
    out = export(run_dir, tmp_path / "model")
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "float32"
    tensors = load_file(out / "model.safetensors")
    assert all(t.dtype == torch.float32 for t in tensors.values()) and not any(
        "lora" in k or "absmax" in k for k in tensors
    )
    assert tensors["model.layers.0.mlp.up_proj.weight"].shape == (128, 64)
    # transformers: the dense folder computes what the 4-bit policy computes (the same dequantised
    # float32 weights; W + s*B@A merged instead of x@W + s*(x@A)@B: float32 rounding only)
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    torch.testing.assert_close(
        sequence_logprobs(loaded, tokenizer), sequence_logprobs(policy, tokenizer), atol=1e-5, rtol=0
    )
    vllm_reads(out)
    accuracy = vllm_serves_the_policy(vllm_engine, out, built, run_dir, min_accuracy=0.8)
    print(f"\nQLoRA export served by vLLM: held-out greedy accuracy {accuracy:.2f} (the run's last evaluation)")
    # the engine factory's copy of the live policy is the same folder (one dequantise-and-save path)
    engine_dir = Path(_save_for_engine(policy, tokenizer))
    assert json.loads((engine_dir / "config.json").read_text()) == config
    engine_tensors = load_file(engine_dir / "model.safetensors")
    assert engine_tensors.keys() == tensors.keys() and all(torch.equal(engine_tensors[k], tensors[k]) for k in tensors)


@pytest.mark.parametrize("written_by", ["this_version", "an_older_version"])
def test_a_qlora_checkpoints_policy_is_rebuilt_4bit_and_exported_dense(tiny_model_path, tmp_path, written_by):
    """build_policy on a QLoRA state dict gives the 4-bit policy as trained (every tensor equal); its
    export computes what it computes (1e-5). Older checkpoints kept the settings only in the config's
    ``quantization_config``: they rebuild the same."""
    from types import SimpleNamespace

    from peft import PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lightning_grpo import LoraSettings, QuantizationSettings
    from lightning_grpo.models.export import build_policy, export_info, write_model_folder
    from lightning_grpo.models.quantization import load_quantized

    lora, quantization = LoraSettings(r=8, alpha=16, target_modules="all-linear"), QuantizationSettings()
    base = load_quantized(str(tiny_model_path), "float32", quantization, torch.device("cpu"))
    policy = get_peft_model(base, lora.to_peft())
    with torch.no_grad():  # a trained adapter: B != 0
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
    module = SimpleNamespace(
        policy=policy,
        lora=lora,
        quantization=quantization,
        model_source=None,
        policy_settings=SimpleNamespace(dtype="float32"),
    )
    info = export_info(module, None)
    assert info["quantization"] == vars(quantization) and "quantization_config" not in info["config"]
    if written_by == "an_older_version":
        info = {
            **info,
            "quantization": None,
            "config": {**info["config"], "quantization_config": base.config.quantization_config.to_dict()},
        }
    rebuilt = build_policy({k: v.clone() for k, v in policy.state_dict().items()}, info)
    assert type(rebuilt.base_model.model.model.layers[1].self_attn.o_proj.base_layer).__name__ == "Linear4bit"
    assert rebuilt.state_dict().keys() == policy.state_dict().keys()
    assert all(torch.equal(rebuilt.state_dict()[k], v) for k, v in policy.state_dict().items())
    out = write_model_folder(rebuilt, None, tmp_path / "model")
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    dense = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    torch.testing.assert_close(
        sequence_logprobs(dense, tokenizer), sequence_logprobs(policy, tokenizer), atol=1e-5, rtol=0
    )
    if written_by == "an_older_version":
        return
    # the adapter alone: its local base is written beside it, the 4-bit base dequantised (what the adapter trained on)
    adapter = write_model_folder(rebuilt, None, tmp_path / "adapter", adapter=True, base_model=str(tiny_model_path))
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == "adapter/base"
    assert "quantization_config" not in json.loads((adapter / "base" / "config.json").read_text())
    loaded = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(adapter / "base", dtype=torch.float32), adapter
    )
    torch.testing.assert_close(
        sequence_logprobs(loaded, tokenizer), sequence_logprobs(policy, tokenizer), atol=1e-5, rtol=0
    )
