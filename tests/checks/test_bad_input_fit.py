"""Bad input, part 2 (group sizes, engines, incompatible options, model paths); see
tests/checks/test_bad_input.py for the rules every case follows."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest
import torch

from lightning_grpo import (
    AlgorithmSettings,
    EvaluationSettings,
    GRPOLoss,
    GRPOModule,
    KLInRewardSettings,
    KLSettings,
    LoraSettings,
    PolicySettings,
    PromptDataModule,
    SamplingConfig,
    SelectionSettings,
    ServerLaunch,
    VLLMArgs,
    VLLMLora,
    VLLMPush,
    WeightSyncSettings,
)
from lightning_grpo.core import ADVANTAGES
from lightning_grpo.data.records import PromptFormat
from lightning_grpo.data.tasks import DigitTask
from tests.helpers.bad_input import cpu_server, cpu_vllm, fit_error, hf_callback

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("tiny_cache")


# =========================================================================== 5. groups
def test_group_of_one_with_std_normalisation_in_core():
    with pytest.raises(
        ValueError,
        match=r"advantage 'grpo' divides by the std of each group's rewards, which needs group_size >= 2 .* got group_size=1",
    ):
        ADVANTAGES.get("grpo")(torch.tensor([1.0, 0.0]), 1)


def test_group_of_one_with_grpo_at_fit_start():
    fit_error(
        ValueError,
        r"rollout.sampling.n=1 leaves 1 completion per prompt, but model.algorithm.advantage='grpo' .*normalised by their reward std.*: set rollout.sampling.n >= 2",
        callback=hf_callback(sampling=SamplingConfig(n=1, max_new_tokens=3)),
    )


def test_gfpo_keep_one_at_fit_start():
    fit_error(
        ValueError,
        r"rollout.selection.gfpo_keep=1 leaves 1 completion per prompt, but model.algorithm.advantage='dr_grpo' .*every advantage would be 0",
        module=GRPOModule(model="tiny:chars", algorithm=AlgorithmSettings(advantage="dr_grpo")),
        callback=hf_callback(selection=SelectionSettings(gfpo_keep=1)),
    )


def test_gfpo_keep_not_below_n():
    with pytest.raises(
        ValueError, match=r"rollout.selection.gfpo_keep must be in \[1, rollout.sampling.n\) = \[1, 4\), got 4"
    ):
        hf_callback(selection=SelectionSettings(gfpo_keep=4))


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "qae"])
def test_batch_not_divisible_by_group_size(name):
    with pytest.raises(ValueError, match=r"batch size B=5 is not divisible by group_size=2"):
        ADVANTAGES.get(name)(torch.zeros(5), 2)


def test_dynamic_sampling_filter_batch_not_divisible():
    from lightning_grpo.core import SELECTIONS

    with pytest.raises(ValueError, match=r"batch size B=3 is not divisible by group_size=2"):
        SELECTIONS.get("dynamic_sampling")(torch.zeros(3), 2)


def test_more_steps_per_generation_than_completions():
    fit_error(
        ValueError,
        r"model.algorithm.steps_per_generation=8 x trainer.accumulate_grad_batches=2 training steps share each generation batch of "
        r"data.batch_size=1 x rollout.sampling.n=4 = 4 completions: some steps would get none",
        module=GRPOModule(model="tiny:chars", algorithm=AlgorithmSettings(steps_per_generation=8)),
        dm=PromptDataModule(DigitTask(), batch_size=1),
        accumulate_grad_batches=2,
    )


# ============================================================================= 6. engines
def test_vllm_not_installed_names_the_extra(monkeypatch):
    from lightning_grpo.rollout.vllm import import_vllm

    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(
        ImportError,
        match=r"engine='vllm' needs vLLM: pip install 'lightning-grpo\[cpu\]' \(CPU\) or 'lightning-grpo\[gpu\]'",
    ):
        import_vllm()


def test_vllm_not_installed_fails_at_fit_setup(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    fit_error(
        ImportError,
        r"needs vLLM: pip install 'lightning-grpo\[cpu\]'.*; or set rollout.engine: hf",
        callback=hf_callback(engine="vllm"),
    )


def test_max_new_tokens_beyond_vllm_max_model_len(monkeypatch):
    monkeypatch.setattr("lightning_grpo.plan.engine_rules.vllm_installed", lambda: True)  # the check needs no engine
    callback = hf_callback(engine=cpu_vllm(max_model_len=12), sampling=SamplingConfig(n=4, max_new_tokens=10))
    fit_error(
        ValueError,
        r"^rollout.engine.init_args.max_model_len=12 is smaller than data.format.max_prompt_length \(6 tokens\) \+ "
        r"rollout.sampling.max_new_tokens \(10\) = 16$",
        callback=callback,
        dm=PromptDataModule(DigitTask(), batch_size=4, format=PromptFormat(max_prompt_length=6)),
    )
    callback = hf_callback(engine=cpu_vllm(max_model_len=12), sampling=SamplingConfig(n=4, max_new_tokens=10))
    fit_error(
        ValueError,
        r"^rollout.engine.init_args.max_model_len=12 is smaller than the longest prompt \(5 tokens\) \+ "
        r"rollout.sampling.max_new_tokens \(10\) = 15$",
        callback=callback,
    )


def test_max_model_len_derived_from_the_data(monkeypatch):
    """Not set: the longest prompt of train / val / test (5 tokens: "1234=") + max_new_tokens, for the engine."""
    monkeypatch.setattr("lightning_grpo.plan.engine_rules.vllm_installed", lambda: True)
    callback = hf_callback(engine=cpu_vllm(max_model_len=12), sampling=SamplingConfig(n=4, max_new_tokens=10))
    fit_error(
        ValueError,
        r"^rollout.engine.init_args.max_model_len=12 is smaller than the longest prompt \(5 tokens\) \+ "
        r"rollout.sampling.max_new_tokens \(10\) = 15$",
        callback=callback,
    )


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"max_num_batched_tokens": 256, "max_model_len": 512},
            r"rollout.engine.init_args.max_num_batched_tokens \(256\) is below max_model_len \(512\): "
            r"on CPU every prompt is prefilled whole in one scheduler step .*raise rollout.engine.init_args.max_num_batched_tokens to at least 512",
        ),
        (
            {"max_model_len": 8192, "extra_llm_kwargs": {"max_num_batched_tokens": 4096}},
            r"rollout.engine.init_args.extra_llm_kwargs.max_num_batched_tokens \(4096\) is below max_model_len \(8192\)",
        ),
        (
            {"extra_llm_kwargs": {"enable_chunked_prefill": True}},
            r"rollout.engine.init_args.extra_llm_kwargs.enable_chunked_prefill=True: "
            r"chunked prefill is not supported with per-request seeds on CPU .*'CPU Generator does not use offset'.*; remove the option",
        ),
    ],
    ids=["budget-below-max-model-len", "extra-budget", "chunked-prefill-on"],
)
def test_cpu_prefill_settings_rejected_before_the_engine_starts(monkeypatch, settings, message):
    monkeypatch.setattr("lightning_grpo.plan.engine_rules.vllm_installed", lambda: True)  # the check needs no engine
    fit_error(ValueError, message, callback=hf_callback(engine=cpu_vllm(**settings)))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"max_num_batched_tokens": 100, "max_model_len": 512},
            r"rollout.engine.init_args.max_num_batched_tokens \(100\) is below max_model_len \(512\)",
        ),
        (
            {"launch": ServerLaunch(args=["--enable-chunked-prefill"])},
            r"rollout.engine.init_args.launch.args '--enable-chunked-prefill': chunked prefill is not supported",
        ),
        (
            {"launch": ServerLaunch(args=["--max-num-batched-tokens=64"])},
            r"rollout.engine.init_args.launch.args '--max-num-batched-tokens=64': set the prefill budget with "
            r"rollout.engine.init_args.max_num_batched_tokens",
        ),
    ],
    ids=["budget", "chunked-prefill-on", "budget-in-server-args"],
)
def test_cpu_server_prefill_settings_rejected_before_any_server_starts(settings, message):
    fit_error(ValueError, message, callback=hf_callback(engine=cpu_server(**settings)))


def test_max_new_tokens_beyond_hf_policy_positions():
    fit_error(
        ValueError,
        r"^the policy's max_position_embeddings \(engine 'hf'\)=512 is smaller than the longest prompt \(5 tokens\) \+ "
        r"rollout.sampling.max_new_tokens \(600\) = 605$",
        callback=hf_callback(sampling=SamplingConfig(n=4, max_new_tokens=600)),
    )


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            lambda: VLLMArgs(dtype="fp32"),
            r"VLLMEngine dtype must be one of \['bfloat16', 'float16', 'float32'\], got 'fp32'",
        ),
        (
            lambda: VLLMArgs(weight_push=VLLMPush(mode="copy")),
            r"rollout.engine.init_args.weight_push.mode must be one of auto, reload, inplace; got 'copy'",
        ),
    ],
    ids=["dtype", "weight_push"],
)
def test_vllm_engine_bad_argument(monkeypatch, tiny_model_path, settings, message):
    from lightning_grpo.rollout.vllm import VLLMEngine

    monkeypatch.setitem(sys.modules, "vllm", None)  # rejected before vLLM is even imported
    with pytest.raises(ValueError, match=message):
        VLLMEngine(str(tiny_model_path), settings())


def test_asynchronous_rollouts_need_an_engine_that_can():
    with pytest.raises(
        ValueError, match=r"^rollout.max_staleness=1 \(asynchronous rollouts\) needs an engine .*got 'hf'$"
    ):
        hf_callback(max_staleness=1)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: EvaluationSettings(samples=-1),
            r"^rollout.evaluation.samples must be an integer >= 0 \(0 = greedy only\), got -1$",
        ),
        (
            lambda: EvaluationSettings(samples=2, pass_k=[1, 3]),
            r"^rollout.evaluation.pass_k: each k must be in 1..rollout.evaluation.samples=2, got 3$",
        ),
        (
            lambda: SelectionSettings(max_generation_rounds=0),
            r"^rollout.selection.max_generation_rounds must be an integer >= 1, got 0$",
        ),
        (
            lambda: WeightSyncSettings(lora="both"),
            r"^rollout.weight_sync.lora must be 'merged' or 'adapter', got 'both'$",
        ),
        (
            lambda: VLLMArgs(max_model_len=0),
            r"^rollout.engine.init_args.max_model_len must be an integer >= 1 or null, got 0$",
        ),
        (
            lambda: VLLMArgs(extra_llm_kwargs={"max_model_len": 64}),
            r"^rollout.engine.init_args.extra_llm_kwargs.max_model_len: set rollout.engine.init_args.max_model_len instead$",
        ),
    ],
    ids=["samples", "pass_k", "rounds", "lora", "max_model_len", "extra-max_model_len"],
)
def test_rollout_sections_reject_bad_values_with_the_field(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_max_staleness_needs_the_loss_correction():
    callback = hf_callback(engine=cpu_server(urls=["http://127.0.0.1:9"]), max_staleness=1)
    fit_error(
        ValueError,
        r"^rollout.max_staleness=1 trains on batches sampled by older weights, but the loss has no off-policy "
        r"correction: set model.loss.init_args.off_policy.correction \(e.g. tis_token\)$",
        callback=callback,
    )


def test_hf_engine_without_eos(tiny_model_path):
    from transformers import AutoModelForCausalLM

    from lightning_grpo.rollout.hf import HFEngine

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    with pytest.raises(
        ValueError, match=r"HFEngine eos_token_id must be the tokenizer's EOS token id \(an int\), got None"
    ):
        HFEngine(model, eos_token_id=None, pad_token_id=0)
    assert HFEngine(model, eos_token_id=2, pad_token_id=None).pad_token_id == 2  # no pad token: pad with EOS


# ================================================================ 7. incompatible options
def test_lora_sync_adapter_without_lora_serving(monkeypatch):
    monkeypatch.setattr("lightning_grpo.plan.engine_rules.vllm_installed", lambda: True)
    fit_error(
        ValueError,
        r"rollout.weight_sync.lora='adapter' needs rollout.engine.init_args.lora.enabled: true",
        module=GRPOModule(model="tiny:chars", policy=PolicySettings(lora=LoraSettings(r=4))),
        callback=hf_callback(engine="vllm", weight_sync=WeightSyncSettings(lora="adapter")),
    )


def test_lora_sync_adapter_with_hf_engine():
    fit_error(
        ValueError,
        r"rollout.weight_sync.lora='adapter' hands the LoRA adapter to vLLM, but rollout.engine is 'hf'",
        module=GRPOModule(model="tiny:chars", policy=PolicySettings(lora=LoraSettings(r=4))),
        callback=hf_callback(weight_sync=WeightSyncSettings(lora="adapter")),
    )


def test_lora_sync_adapter_without_lora(monkeypatch):
    monkeypatch.setattr("lightning_grpo.plan.engine_rules.vllm_installed", lambda: True)
    callback = hf_callback(engine=cpu_vllm(lora=VLLMLora(enabled=True)), weight_sync=WeightSyncSettings(lora="adapter"))
    fit_error(
        ValueError,
        r"rollout.weight_sync.lora='adapter' needs a LoRA policy, but model.policy.lora is not set",
        callback=callback,
    )


def test_reference_adapter_without_lora():
    with pytest.raises(ValueError, match=r"model.policy.reference 'adapter' needs model.policy.lora"):
        GRPOModule(model="tiny:chars", policy=PolicySettings(reference="adapter"))


def test_kl_beta_with_reference_none():
    fit_error(
        ValueError,
        r"model.loss.init_args.kl.beta=0.04 puts a KL to the reference model in the loss, but model.policy.reference='none'",
        module=GRPOModule(
            model="tiny:chars", loss=GRPOLoss(kl=KLSettings(beta=0.04)), policy=PolicySettings(reference="none")
        ),
    )


def test_kl_in_reward_with_reference_none():
    fit_error(
        ValueError,
        r"model.algorithm.kl_in_reward.coef=0.1 subtracts a KL to the reference model from the rewards, but model.policy.reference='none'",
        module=GRPOModule(
            model="tiny:chars",
            algorithm=AlgorithmSettings(kl_in_reward=KLInRewardSettings(coef=0.1)),
            policy=PolicySettings(reference="none"),
        ),
    )


def test_temperature_zero_for_training():
    with pytest.raises(
        ValueError, match=r"rollout.sampling.temperature must be > 0 for training \(0 is greedy decoding\)"
    ):
        hf_callback(sampling=SamplingConfig(temperature=0.0))


@pytest.mark.parametrize(
    ("lr", "message"),
    [
        (-1e-3, r"model.optimizer: AdamW rejected its arguments: Invalid learning rate: -0.001"),
        (0.0, r"model.optimizer: the learning rate must be > 0 \(0 never changes the policy\), got 0.0"),
    ],
    ids=["negative", "zero"],
)
def test_learning_rate_not_positive(lr, message):
    fit_error(
        ValueError,
        message,
        module=GRPOModule(model="tiny:chars", optimizer=functools.partial(torch.optim.AdamW, lr=lr)),
    )


def test_num_iterations_zero():
    with pytest.raises(ValueError, match=r"model.algorithm.num_iterations must be an integer >= 1, got 0"):
        GRPOModule(model="tiny:chars", algorithm=AlgorithmSettings(num_iterations=0))


# ================================================================================ 8. model
def test_model_directory_without_config(tmp_path):
    fit_error(
        FileNotFoundError,
        rf"model.model: {tmp_path} has no config.json \(expected a Hugging Face model directory",
        module=GRPOModule(model=str(tmp_path)),
    )


def test_model_path_missing(tmp_path):
    fit_error(
        FileNotFoundError,
        rf"model.model: {tmp_path}/nowhere is not a directory",
        module=GRPOModule(model=str(tmp_path / "nowhere")),
    )
