"""The weight push check on real engines: a push that did not land stops the run with one line; healthy pushes
pass (the rule itself, on hand-set log-probs: test_push_check_rule.py).

Each path is broken on purpose: the HF engine given a copy of the policy, the in-process vLLM engine whose
push does nothing / skips a layer / renames a tensor, its LoRA adapter never loaded or not reloaded, and a
vLLM server whose push does nothing. Unit level on the shared engines (no training run) except one short HF
run that checks the RolloutCallback stops the fit. Each check is calibrated on the engine that took the probe.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch

from lightning_grpo.callbacks.push_check import PushCheck, WeightPushError, probe_batch, tolerance_for
from lightning_grpo.callbacks.settings import WeightSyncSettings
from lightning_grpo.callbacks.weight_push import PolicyPush
from lightning_grpo.core.batch import RolloutBatch
from lightning_grpo.models.weights import policy_weights_for_engine
from lightning_grpo.rollout.hf import HFEngine

EOS, PAD = 1, 0
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _module(policy):
    from lightning_grpo import GRPOModule

    module = GRPOModule(model=policy)
    module.configure_model()
    return module


def _policy(path, lora: bool = False):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=LORA_TARGETS))
        _nudge(model, "lora_B", 0.2, seed=0)  # peft starts B at zero (a no-op adapter): make it matter
    return model.train()


def _nudge(model, only: str = "", scale: float = 0.05, seed: int = 1) -> None:
    """A stand-in optimizer step: every parameter whose name contains ``only`` moves by noise of ``scale``."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if only in name:
                param.add_(torch.randn(param.shape, generator=gen) * scale)


def _batch() -> RolloutBatch:
    """Two rows of a rollout batch: prompts [5 6 7] and [8 9] (left-padded), completions [10 11 1] and [12]."""
    ids = torch.tensor([[5, 6, 7, 10, 11, 1], [0, 8, 9, 12, 0, 0], [0, 8, 9, 13, 0, 0]])  # [3, 3 + 3]
    mask = (torch.arange(6) >= torch.tensor([[0], [1], [1]])) & (torch.arange(6) < torch.tensor([[6], [4], [4]]))
    completion = mask[:, 3:].float()  # [3, 3]
    return RolloutBatch(ids, mask.long(), completion, torch.zeros(3), torch.zeros(3, 3), 3, 3, 1.0)


def _probed(module, engine) -> PushCheck:
    """A check on every push whose probe ``engine`` scores now (it must hold the policy's weights)."""
    check = PushCheck(every=1)
    check.take_probe(module, _batch(), engine, step=0)
    return check


# ------------------------------------------------------------------------------------ the probe
def test_the_probe_is_the_first_two_rows_without_padding_cut_below_max_model_len(tiny_model_path):
    policy = _policy(tiny_model_path)
    module = _module(policy)
    engine = HFEngine(policy, EOS, PAD)
    check = _probed(module, engine)
    assert check.probe == [[5, 6, 7, 10, 11, 1], [8, 9, 12]]
    assert check.noise < 1e-6 and check.current_tolerance() == 1e-5  # the engine is the policy: the float32 floor
    engine.max_model_len = 5
    assert _probed(module, engine).probe == [[5, 6, 7, 10], [8, 9, 12]]  # + 1 generated token fits
    batch = probe_batch(check.probe, torch.device("cpu"))
    assert batch.prompt_length == 1 and batch.completion_mask.tolist() == [[1.0] * 5, [1.0, 1.0, 0, 0, 0]]
    assert [len(x) for x in check._history[0].logp] == [5, 2]  # the trainer's log-probs at step 0, per token


def test_the_check_runs_at_the_first_push_then_every_kth():
    check = PushCheck(every=3)
    assert not check.due()  # no probe yet: nothing checked, nothing counted
    check.probe = [[1, 2]]
    assert [check.due() for _ in range(7)] == [True, False, False, True, False, False, True]
    off = PushCheck(every=0)
    off.probe = [[1, 2]]
    assert not any(off.due() for _ in range(3))


def test_tolerance_follows_the_least_precise_dtype(tiny_model_path):
    policy = _policy(tiny_model_path)
    engine = HFEngine(policy, EOS, PAD)
    assert tolerance_for(engine, policy, "32-true") == 1e-5
    assert tolerance_for(engine, policy, "bf16-mixed") == 5e-2
    assert tolerance_for(engine, policy, "16-mixed") == 1e-2
    engine.dtype = torch.bfloat16  # an engine computing in bf16 next to a float32 trainer
    assert tolerance_for(engine, policy, "32-true") == 5e-2


def test_settings_refuse_a_negative_interval_and_tolerance():
    with pytest.raises(ValueError, match=r"rollout.weight_sync.check_every must be an integer >= 0"):
        WeightSyncSettings(check_every=-1)
    with pytest.raises(ValueError, match=r"rollout.weight_sync.check_tolerance must be > 0"):
        WeightSyncSettings(check_tolerance=0.0)


# ---------------------------------------------------------------------------------- HF engine
def test_hf_engine_on_the_policy_passes_and_on_a_copy_names_the_stale_step(tiny_model_path):
    policy = _policy(tiny_model_path)
    module = _module(policy)
    live, frozen = HFEngine(policy, EOS, PAD), HFEngine(copy.deepcopy(policy), EOS, PAD)
    check = _probed(module, live)
    step0 = check.expect(module, 0)
    _nudge(policy)
    check.verify(live, check.expect(module, 1), step0)  # same model: passes
    with pytest.raises(WeightPushError) as err:
        check.verify(frozen, check.expect(module, 1), step0)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("weight push check: HFEngine (its model) at step 1 does not sample with the pushed")
    assert re.search(
        r"; they match step 0's weights \(\d\.\d+e-0[78]\): the engine still holds step 0's weights \(no layer was updated\)$",
        message,
    ), message


def test_a_run_whose_engine_misses_the_updates_stops_at_the_first_check(tiny_model_path):
    import lightning as L

    from lightning_grpo import GRPOModule, PromptDataModule, RewardSpec, RolloutCallback, Rows, SamplingConfig

    policy = _policy(tiny_model_path)
    module = GRPOModule(model=policy, optimizer=lambda p: torch.optim.AdamW(p, lr=0.1), default_guards=False)
    rollout = RolloutCallback(
        engine="hf",
        sampling=SamplingConfig(n=4, max_new_tokens=2),
        rewards=[RewardSpec("prefix_match")],
        weight_sync=WeightSyncSettings(check_every=1),
        seed=0,
    )
    rollout.use_engine(HFEngine(copy.deepcopy(policy), EOS, PAD))  # never sees an update
    rows = [{"prompt": f"{i:04d}=", "answer": str((i + 1) % 10)} for i in range(16)]
    data = PromptDataModule(source=Rows(rows), tokenizer_path=tiny_model_path, batch_size=4)
    trainer = L.Trainer(
        max_steps=4, callbacks=[rollout], accelerator="cpu", logger=False, enable_progress_bar=False,
        enable_checkpointing=False, enable_model_summary=False, limit_val_batches=0,
    )  # fmt: skip
    with pytest.raises(WeightPushError, match=r"HFEngine \(its model\) at step 1 .*still holds step 0's weights"):
        trainer.fit(module, datamodule=data)
    assert trainer.global_step == 1  # stopped before the second optimizer step


# ------------------------------------------------------------------------ in-process vLLM: merged
@pytest.mark.vllm
def test_vllm_merged_push_passes_and_each_break_is_named(vllm_engine, tiny_model_path, monkeypatch):
    from lightning_grpo.rollout.vllm_push import CpuInplacePush

    policy = _policy(tiny_model_path)
    module = _module(policy)
    vllm_engine.load_weights(policy_weights_for_engine(policy))
    check = _probed(module, vllm_engine)
    assert check.current_tolerance() == 1e-5  # the float32 floor: this engine's noise is far below it
    step0 = check.expect(module, 0)
    _nudge(policy)
    vllm_engine.load_weights(policy_weights_for_engine(policy))
    scores = vllm_engine.score(check.probe)["in-process vLLM"]
    step1 = check.expect(module, 1)
    assert max(float((s - e).abs().max()) for s, e in zip(scores, step1.logp)) < 1e-6
    check.verify(vllm_engine, step1, step0)

    _nudge(policy, seed=2)  # step 2: the push does nothing
    with monkeypatch.context() as patch:
        patch.setattr(vllm_engine, "load_weights", lambda weights, version=None: None)
        vllm_engine.load_weights(policy_weights_for_engine(policy))
        with pytest.raises(WeightPushError, match=r"VLLMEngine \(in-process vLLM\) at step 2 .*still holds step 1's"):
            check.verify(vllm_engine, check.expect(module, 2), step1)

    def skip_one_layer(self, lin, weights, original=CpuInplacePush._load_linear):
        if lin.sources != ["model.layers.1.mlp.down_proj"]:
            original(self, lin, weights)

    with monkeypatch.context() as patch:  # step 2 again: one layer of the push skipped
        patch.setattr(CpuInplacePush, "_load_linear", skip_one_layer)
        vllm_engine.load_weights(policy_weights_for_engine(policy))
        with pytest.raises(WeightPushError, match=r"at step 2 .*match no earlier weights: part of the weights"):
            check.verify(vllm_engine, check.expect(module, 2), step1)
    vllm_engine.load_weights(policy_weights_for_engine(policy))
    check.verify(vllm_engine, check.expect(module, 2), step1)  # a push that lands passes again


# ----------------------------------------------------------------------- in-process vLLM: adapter
@pytest.mark.vllm
def test_vllm_adapter_not_loaded_and_not_reloaded_are_named(vllm_engine, tiny_model_path, monkeypatch):
    policy = _policy(tiny_model_path, lora=True)
    module = _module(policy)
    push = PolicyPush("adapter")
    check = PushCheck(every=1, adapter=True)
    try:
        with monkeypatch.context() as patch:  # the adapter never reaches the engine: the probe finds it out
            patch.setattr(vllm_engine, "load_lora_adapter", lambda path: None)
            push(vllm_engine, policy, 0, first=True)
            with pytest.raises(
                WeightPushError, match=r"at step 0 .*without its LoRA adapter \(\S+\): .*\(adapter not loaded\)$"
            ):
                check.take_probe(module, _batch(), vllm_engine, step=0)
        push(vllm_engine, policy, 0, first=False)  # the real load: the probe is calibrated
        check = PushCheck(every=1, adapter=True)
        check.take_probe(module, _batch(), vllm_engine, step=0)
        step0 = check.expect(module, 0)
        _nudge(policy, "lora_B", seed=3)
        with monkeypatch.context() as patch:  # step 1: the new adapter is not handed over
            patch.setattr(vllm_engine, "load_lora_adapter", lambda path: None)
            push(vllm_engine, policy, 1, first=False)
            with pytest.raises(WeightPushError, match=r"at step 1 .*still holds step 0's weights"):
                check.verify(vllm_engine, check.expect(module, 1), step0)
        push(vllm_engine, policy, 1, first=False)
        check.verify(vllm_engine, check.expect(module, 1), step0)  # passes once it is
    finally:
        vllm_engine.unload_lora_adapter()
        push.close()


# ------------------------------------------------------------------------------- vLLM server
def pushed_and_checked_once(engine, policy, module) -> PushCheck:
    """Push step 0, take the probe, push a nudged step 1 and check it (it passes); the policy is nudged again
    for a step 2 the caller pushes and checks (``check.after_push(engine, module, 2)``). Returns the check."""
    engine.load_weights(policy_weights_for_engine(policy), version=0)
    check = _probed(module, engine)
    _nudge(policy)
    engine.load_weights(policy_weights_for_engine(policy), version=1)
    check.after_push(engine, module, 1)
    _nudge(policy, seed=2)
    return check


@pytest.mark.vllm
def test_server_push_that_does_nothing_is_caught(vllm_server, tiny_model_path, monkeypatch):
    from lightning_grpo.rollout.server_client import ServerClient
    from lightning_grpo.rollout.server_engine import ServerEngine

    policy = _policy(tiny_model_path)
    module = _module(policy)
    engine = ServerEngine([ServerClient(vllm_server)])
    try:
        check = pushed_and_checked_once(engine, policy, module)
        monkeypatch.setattr(engine.transport, "push", lambda client, prepared, version: None)
        engine.load_weights(policy_weights_for_engine(policy), version=2)
        with pytest.raises(WeightPushError, match=rf"ServerEngine \({vllm_server}\) at step 2 .*still holds step 1's"):
            check.after_push(engine, module, 2)
    finally:
        engine.close()
