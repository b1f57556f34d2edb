"""QLoRA: a 4-bit base (bitsandbytes nf4 / fp4) under a LoRA adapter. The weight push gives the
engine the dequantised base with the adapter merged (or the base and the adapter apart), so the
engine's log-probs equal the 4-bit policy's after every push."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("bitsandbytes")  # the qlora extra, part of dev (CI installs it)

from lightning_grpo import (
    GRPOLoss,
    GRPOModule,
    KLSettings,
    LoraSettings,
    PolicySettings,
    QuantizationSettings,
    RewardSpec,
    RolloutCallback,
    SamplingConfig,
    VLLMArgs,
    VLLMLora,
    WeightSyncSettings,
)
from lightning_grpo.callbacks.weight_push import PolicyPush
from lightning_grpo.models.quantization import keep_float_kernels, load_quantized
from lightning_grpo.models.weights import policy_weights_for_engine

CPU = torch.device("cpu")


def _qlora_policy(path, quant_type="nf4", double_quant=True):
    """The tiny model in 4 bits with a LoRA adapter on every linear layer whose B is not zero."""
    from peft import LoraConfig, get_peft_model

    base = load_quantized(str(path), "float32", QuantizationSettings(quant_type, double_quant), CPU)
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", init_lora_weights=False))
    return model.train()


def _dense(path, weights):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    model.load_state_dict(dict(weights), strict=True)  # every tensor present, HF names, dense shapes
    return model.train()


@pytest.mark.parametrize("quant_type, double_quant", [("nf4", True), ("fp4", False)])
def test_pushed_weights_compute_what_the_4bit_policy_computes(tiny_model_path, quant_type, double_quant):
    from bitsandbytes.nn import Linear4bit
    from transformers import AutoModelForCausalLM

    policy = _qlora_policy(tiny_model_path, quant_type, double_quant)
    assert isinstance(policy.base_model.model.model.layers[0].mlp.up_proj.base_layer, Linear4bit)
    ids = torch.randint(5, 40, (4, 24), generator=torch.Generator().manual_seed(0))
    original = AutoModelForCausalLM.from_pretrained(str(tiny_model_path), dtype=torch.float32)
    with torch.no_grad():
        merged = _dense(tiny_model_path, policy_weights_for_engine(policy))
        gap = (merged(ids).logits - policy(ids).logits).abs().max().item()
        with policy.disable_adapter():  # the reference: the 4-bit base alone
            base = _dense(tiny_model_path, policy_weights_for_engine(policy))
            base_gap = (base(ids).logits - policy(ids).logits).abs().max().item()
        adapter_effect = (merged(ids).logits - base(ids).logits).abs().max().item()
    quantisation_error = (
        (base.model.layers[0].mlp.up_proj.weight - original.model.layers[0].mlp.up_proj.weight).abs().max()
    )
    print(
        f"\n{quant_type}: |dense - 4bit| logits {gap:.1e}, adapter off {base_gap:.1e}; adapter effect {adapter_effect:.2f}"
    )
    assert gap < 1e-5 and base_gap < 1e-5
    assert adapter_effect > 0.1 and quantisation_error > 1e-3  # both the adapter and the 4 bits are real


def test_adapter_free_push_is_the_dequantised_base(tiny_model_path):
    """merge_lora=False (weight_sync.lora: adapter) pushes the same base the disabled adapter leaves."""
    policy = _qlora_policy(tiny_model_path)
    base = dict(policy_weights_for_engine(policy, merge_lora=False))
    with policy.disable_adapter():
        reference = dict(policy_weights_for_engine(policy))
    assert base.keys() == reference.keys()
    assert all(torch.equal(base[k], reference[k]) for k in base)


def test_eval_forward_keeps_the_float_kernels(tiny_model_path):
    """An eval-mode forward without gradients (the HF engine's generate) must not repack the 4-bit
    layers for bitsandbytes' bfloat16 CPU kernel: the logits stay those of training mode."""
    policy = _qlora_policy(tiny_model_path)
    ids = torch.randint(5, 40, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        train_logits = policy(ids).logits
        eval_logits = policy.eval()(ids).logits
    assert torch.equal(train_logits, eval_logits)
    dict(policy_weights_for_engine(policy))  # still dequantisable


def test_a_repacked_layer_is_refused(tiny_model_path):
    from bitsandbytes.functional import has_avx512bf16
    from transformers import AutoModelForCausalLM

    if not has_avx512bf16():
        pytest.skip("bitsandbytes repacks 4-bit layers only on CPUs with AVX512-BF16")
    config = QuantizationSettings().to_bitsandbytes("float32")
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_path), quantization_config=config, device_map="cpu")
    with torch.no_grad():
        model.eval()(torch.tensor([[5, 6, 7]]))  # no keep_float_kernels: bitsandbytes repacks
    with pytest.raises(ValueError, match=r"model.layers.0.self_attn.q_proj.weight was repacked by bitsandbytes"):
        dict(policy_weights_for_engine(model))
    keep_float_kernels(model)  # (a fresh load with it would have avoided this)


# ------------------------------------------------------------------------------ configuration
def test_quantization_needs_lora():
    with pytest.raises(ValueError, match=r"model.policy.quantization needs model.policy.lora"):
        GRPOModule(model="tiny:chars", policy=PolicySettings(quantization=QuantizationSettings()))


def test_quantization_needs_a_model_path(tiny_model_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_path))
    with pytest.raises(
        ValueError,
        match=r"model.policy.quantization loads a model path in 4 bits, but model is an nn.Module \(Qwen2ForCausalLM\)",
    ):
        GRPOModule(model=model, policy=PolicySettings(lora=LoraSettings(r=4), quantization=QuantizationSettings()))


def test_quantization_without_bitsandbytes(monkeypatch):
    import lightning_grpo.models.quantization as quantization

    monkeypatch.setattr(quantization, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match=r"needs bitsandbytes: pip install 'lightning-grpo\[qlora\]'"):
        GRPOModule(
            model="tiny:chars", policy=PolicySettings(lora=LoraSettings(r=4), quantization={"quant_type": "nf4"})
        )


def test_quantization_does_not_shard_with_fsdp2(tiny_model_path):
    module = GRPOModule(
        model=str(tiny_model_path), policy=PolicySettings(lora=LoraSettings(r=4), quantization=QuantizationSettings())
    )
    module._device_mesh = object()  # what ModelParallelStrategy sets before configure_model
    with pytest.raises(NotImplementedError, match=r"model.policy.quantization \(QLoRA\) does not shard with FSDP2"):
        module.configure_model()


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("quant_type", "int4", r"quantization.quant_type must be 'nf4' or 'fp4', got 'int4'"),
        (
            "compute_dtype",
            "float64",
            r"quantization.compute_dtype must be float32, bfloat16, float16 or null, got 'float64'",
        ),
    ],
)
def test_bad_quantization_settings(field, value, message):
    with pytest.raises(ValueError, match=message):
        QuantizationSettings(**{field: value})


# ------------------------------------------------------------------------- the vLLM engine
@pytest.mark.vllm
@pytest.mark.parametrize("lora_sync", ["merged", "adapter"])
def test_engine_logprobs_follow_the_4bit_policy(vllm_engine, tiny_model_path, lora_sync):
    """After each push the engine's log-probs equal the 4-bit policy's (1e-4); a step without a push
    leaves them apart."""
    from tests.helpers.rollout import max_logprob_gap
    from tests.rollout.test_vllm import LONG_PROMPTS, SAMPLING, TEMPERATURE, _train_step

    policy = _qlora_policy(tiny_model_path)
    optimizer = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=2e-2)
    push = PolicyPush(lora_sync)
    try:
        push(vllm_engine, policy, step=0, first=True)
        first = vllm_engine.generate(LONG_PROMPTS, SAMPLING, seed=0)
        synced = [max_logprob_gap(policy, first, TEMPERATURE)]
        _train_step(policy, optimizer, first)
        stale = max_logprob_gap(policy, vllm_engine.generate(LONG_PROMPTS, SAMPLING, seed=1), TEMPERATURE)
        push(vllm_engine, policy, step=1, first=False)
        synced.append(max_logprob_gap(policy, vllm_engine.generate(LONG_PROMPTS, SAMPLING, seed=2), TEMPERATURE))
    finally:
        push.close()
        vllm_engine.unload_lora_adapter()
    print(f"\nQLoRA, lora_sync {lora_sync}: synced {synced}, stale {stale:.3f}")
    assert max(synced) <= 1e-4 and stale > 0.1


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("lora_sync", ["merged", "adapter"])
def test_qlora_training_keeps_engine_and_policy_together(vllm_engine, tiny_model_path, lora_sync):
    """GRPOModule(quantization=...) end to end: 4-bit base, adapter-off reference (beta > 0), and at
    every step the engine's log-probs of the sampled tokens equal the policy's (mismatch <= 1e-4)."""
    from tests.training.test_training import _fit

    module = GRPOModule(
        model=str(tiny_model_path),
        loss=GRPOLoss(kl=KLSettings(beta=0.04)),
        policy=PolicySettings(lora=LoraSettings(r=4, alpha=8), quantization=QuantizationSettings()),
        optimizer=lambda p: torch.optim.AdamW(p, lr=2e-2),
    )
    callback = RolloutCallback(
        engine=VLLMArgs(lora=VLLMLora(enabled=True)),
        sampling=SamplingConfig(n=4, max_new_tokens=3),
        rewards=[RewardSpec("prefix_match")],
        seed=3,
        weight_sync=WeightSyncSettings(lora=lora_sync),
    )
    callback.use_engine(vllm_engine)
    _, recorder = _fit(module, callback, steps=3)
    gaps = [s["train/mismatch_max_abs"] for s in recorder.steps]
    assert module.reference_mode == "adapter"
    assert type(module.policy.base_model.model.model.layers[0].self_attn.q_proj.base_layer).__name__ == "Linear4bit"
    assert len(gaps) == 3 and max(gaps) <= 1e-4, gaps
    assert vllm_engine._lora_request is None  # the callback took its adapter back at teardown


def test_a_resumed_qlora_checkpoint_loads_into_a_rebuilt_policy(tiny_model_path):
    """A resume rebuilds the 4-bit base from model.model; the checkpoint's quantisation-state tensors
    (``weight.absmax``, ...), which ``load_state_dict`` does not take, are checked against it and
    removed, so Lightning's strict load succeeds; a checkpoint of another base is refused by name."""
    from lightning_grpo.models.quantization import take_quant_state

    trained, fresh = _qlora_policy(tiny_model_path), _qlora_policy(tiny_model_path)
    state = trained.state_dict()
    with pytest.raises(RuntimeError, match="Unexpected key"):
        fresh.load_state_dict(dict(state), strict=True)  # what a resume hit before
    take_quant_state(state, fresh)
    fresh.load_state_dict(state, strict=True)
    for (name, a), b in zip(trained.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), name
    other = trained.state_dict()
    key = next(k for k in other if k.endswith(".weight.absmax"))
    other[key] = other[key] * 2
    with pytest.raises(ValueError, match=r"differs from the one built from model.model \(.*absmax\)"):
        take_quant_state(other, fresh)
