"""Sleep mode of the colocated vLLM engine (`VLLMArgs.sleep_level`): the order of the calls.

On CPU vLLM's sleep / wake_up free nothing, but the engine makes the same calls as on a GPU, so the
order is checked here: a recording double of ``vllm.LLM`` (the session engine's own LLM behind a
proxy that writes down every sleep, wake_up and generate) under a short training run. The memory
it frees is measured on a GPU (``test_sleep_frees_gpu_memory``, skipped without CUDA).
"""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lightning_grpo import (
    EvaluationSettings,
    GRPOModule,
    PromptDataModule,
    RewardSpec,
    RolloutCallback,
    SamplingConfig,
    VLLMArgs,
)
from lightning_grpo.data.tasks import DigitTask
from lightning_grpo.rollout.sleep import EngineSleep


class FakeLLM:
    """Records the sleep-mode calls of :class:`EngineSleep`."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def sleep(self, level: int) -> None:
        self.calls.append(f"sleep({level})")

    def wake_up(self, tags=None) -> None:
        self.calls.append(f"wake_up({tags})")


# ------------------------------------------------------------------------------- the state machine
@pytest.mark.parametrize("level", [1, 2])
def test_push_wakes_the_weights_then_generate_the_kv_cache(level):
    llm, state = FakeLLM(), EngineSleep(level)
    state.sleep(llm)
    state.sleep(llm)  # asleep already: no second call
    state.before_push(llm)
    state.after_push()
    state.before_generate(llm)
    state.before_generate(llm)  # awake: nothing to do
    assert llm.calls == [f"sleep({level})", "wake_up(['weights'])", "wake_up(['kv_cache'])"]


def test_generate_without_a_push_wakes_everything_at_level_1():
    llm, state = FakeLLM(), EngineSleep(1)
    state.sleep(llm)
    state.before_generate(llm)
    assert llm.calls == ["sleep(1)", "wake_up(None)"]
    assert not state.weights_discarded


def test_level_2_needs_a_push_before_generate():
    llm, state = FakeLLM(), EngineSleep(2)
    state.sleep(llm)
    assert state.weights_discarded
    with pytest.raises(RuntimeError, match=r"slept at level 2 .* no weights were pushed since"):
        state.before_generate(llm)
    assert llm.calls == ["sleep(2)"]  # nothing woke


def test_level_0_makes_no_call():
    llm, state = FakeLLM(), EngineSleep(0)
    state.sleep(llm)
    state.before_push(llm)
    state.before_generate(llm)
    assert llm.calls == []


@pytest.mark.parametrize("level", [3, -1, "1"])
def test_bad_sleep_level(level):
    with pytest.raises(ValueError, match=r"rollout.engine.init_args.sleep_level must be 0 \(off\), 1 or 2"):
        EngineSleep(level)


def test_sleep_level_2_without_weight_sync_is_refused():
    from lightning_grpo import WeightSyncSettings
    from tests.helpers.bad_input import cpu_vllm, fit_error, hf_callback

    fit_error(
        ValueError,
        r"rollout.engine.init_args.sleep_level=2 discards the engine's weights .* needs rollout.weight_sync.enabled: true",
        callback=hf_callback(engine=cpu_vllm(sleep_level=2), weight_sync=WeightSyncSettings(enabled=False)),
    )


# ------------------------------------------------------------------ the real engine, in training
class RecordingLLM:
    """Stands in for the engine's ``vllm.LLM``: writes down sleep / wake_up / generate and forwards
    every call to the real one (sleep and wake_up only pause and resume its scheduler on CPU)."""

    def __init__(self, llm, calls: list[str]) -> None:
        self._llm, self.calls = llm, calls

    def __getattr__(self, name):
        return getattr(self._llm, name)

    def sleep(self, level: int = 1, **kwargs):
        self.calls.append(f"sleep({level})")
        return self._llm.sleep(level=level, **kwargs)

    def wake_up(self, tags=None):
        self.calls.append(f"wake_up({tags})")
        return self._llm.wake_up(tags)

    def generate(self, *args, **kwargs):
        self.calls.append("generate")
        return self._llm.generate(*args, **kwargs)


@pytest.fixture
def recording_engine(vllm_engine, monkeypatch):
    """The session engine with a recording LLM; ``engine.calls`` lists generate / sleep / wake_up and
    every finished weight push ("push"). Restored afterwards (awake, sleep off)."""
    calls: list[str] = []
    original_push = vllm_engine.load_weights

    def push(weights, version=None):
        original_push(weights, version=version)
        calls.append("push")

    monkeypatch.setattr(vllm_engine, "_llm", RecordingLLM(vllm_engine._llm, calls))
    monkeypatch.setattr(vllm_engine, "load_weights", push)
    vllm_engine.calls = calls
    yield vllm_engine
    if vllm_engine._sleep.asleep:
        vllm_engine._llm.wake_up()
    vllm_engine._sleep = EngineSleep(0)
    del vllm_engine.calls


@pytest.fixture
def tiny_cache_env(tiny_model_path, monkeypatch):
    """The built-in tiny model resolves to the session's copy (GRPOModule(model=None))."""
    from pathlib import Path

    monkeypatch.setenv("LIGHTNING_GRPO_CACHE", str(Path(tiny_model_path).parent))


def _train(engine, steps: int, evaluate_first: bool) -> None:
    L.seed_everything(0)
    callback = RolloutCallback(
        engine="vllm",
        sampling=SamplingConfig(n=4, max_new_tokens=3),
        rewards=[RewardSpec("prefix_match")],
        seed=3,
        evaluation=EvaluationSettings(samples=2),
    )
    callback.use_engine(engine)
    trainer = L.Trainer(
        max_steps=steps,
        callbacks=[callback],
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=1 if evaluate_first else 0,
        val_check_interval=1000,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
    )
    module = GRPOModule(model="tiny:chars", optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2))
    trainer.fit(module, datamodule=PromptDataModule(DigitTask(num_val=4), batch_size=4))


@pytest.mark.vllm
@pytest.mark.parametrize("level", [1, 2])
def test_call_order_in_training(recording_engine, tiny_cache_env, level):
    """Held-out evaluation at step 0 (two generate calls: greedy, sampled), then 3 training steps: the
    engine sleeps after every generation batch, and wakes its weights for each push before its KV
    cache. At step 0 the policy has not changed since the evaluation's push: level 1 wakes everything
    without a push, level 2 (weights dropped) pushes again first. The push of step 1 is the push check's
    first (``rollout.weight_sync.check_every``): the engine scores the probe after it, awake; at step 0 it scores
    the probe once before it sleeps (the push check's calibration)."""
    recording_engine._sleep = EngineSleep(level)
    _train(recording_engine, steps=3, evaluate_first=True)
    sleep, woken = f"sleep({level})", ["wake_up(['weights'])", "push", "wake_up(['kv_cache'])"]
    evaluation = ["push", "generate", "generate", sleep]  # the first push finds the engine awake
    step0 = (["wake_up(None)"] if level == 1 else woken) + ["generate", "generate", sleep]  # the rollout, the probe
    later = [*woken, "generate", sleep]
    checked = [*woken, "generate", *later[-2:]]  # step 1: the push check scores its probe (a generate) first
    assert recording_engine.calls == evaluation + step0 + checked + later


# ------------------------------------------------------------------------------------ on a GPU
@pytest.mark.gpu
@pytest.mark.vllm
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (vLLM has no sleep mode on CPU)")
@pytest.mark.parametrize("level", [1, 2])
def test_sleep_frees_gpu_memory(tiny_model_path, level):
    """The KV cache (256 MiB here) and, at level 2 or offloaded at 1, the weights leave the GPU; after
    a push and a wake the engine samples the same tokens as before it slept."""
    from transformers import AutoModelForCausalLM

    from lightning_grpo.rollout.vllm import VLLMEngine

    kv_bytes = 256 * 1024**2
    engine = VLLMEngine(
        str(tiny_model_path),
        VLLMArgs(max_model_len=512, sleep_level=level, kv_cache_memory_bytes=kv_bytes, gpu_memory_utilization=0.2),
    )
    try:
        weights = list(AutoModelForCausalLM.from_pretrained(str(tiny_model_path)).state_dict().items())
        sampling = SamplingConfig(n=4, max_new_tokens=8)
        before = engine.generate([[5, 6, 7, 8]], sampling, seed=1)
        torch.cuda.synchronize()
        free_awake = torch.cuda.mem_get_info()[0]
        engine.sleep()
        freed = torch.cuda.mem_get_info()[0] - free_awake
        print(f"sleep level {level} freed {freed / 2**20:.0f} MiB")
        assert freed >= 0.95 * kv_bytes
        engine.load_weights(weights)
        after = engine.generate([[5, 6, 7, 8]], sampling, seed=1)
        assert after.completion_ids == before.completion_ids
    finally:
        engine.close()
