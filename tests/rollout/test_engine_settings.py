"""``rollout.engine`` as typed settings: the short names, the defaults that follow the device and the model
(their numbers), what each engine declares it can do, and a new engine added as its module, its settings
and one registration (a stand-in that samples uniformly at random, trained from Python and from a recipe)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import lightning as L
import pytest
import torch
import yaml

from lightning_grpo import (
    GRPOModule,
    HFSettings,
    PromptDataModule,
    RewardSpec,
    RolloutCallback,
    SamplingConfig,
    ServerSettings,
    VLLMArgs,
    WeightSyncSettings,
)
from lightning_grpo.data.tasks import DigitTask
from lightning_grpo.rollout.base import Rollout, RolloutEngine
from lightning_grpo.rollout.engine_defaults import (
    KV_CACHE_FLOOR_BYTES,
    cpu_kv_cache_bytes,
    default_dtype,
    kv_bytes_per_token,
)
from lightning_grpo.rollout.engine_settings import ENGINES, EngineContext, EngineSettings, register_engine
from lightning_grpo.rollout.factory import resolve_engine
from tests.helpers.bad_input import cli, write_config

MIB = 2**20
#: The tiny models' shape (2 layers, 2 KV heads, head_dim 32) and SmolLM2-135M's (30 layers, 3 KV heads of 64).
TINY = {"num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2, "hidden_size": 64}
SMOLLM2 = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}


# --------------------------------------------------------------------------- a new engine
class UniformEngine(RolloutEngine):
    """The stand-in engine: every token uniformly at random from the vocabulary, so each log-prob is -log(V)."""

    needs_weight_sync = False  # it has no weights
    built: ClassVar[list[UniformEngine]] = []  # every one built, for the tests to look at

    def __init__(self, vocab_size: int, seed: int) -> None:
        self.vocab_size, self.seed, self.calls = vocab_size, seed, 0
        UniformEngine.built.append(self)

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig, seed: int) -> Rollout:
        self.calls += 1
        generator = torch.Generator().manual_seed(seed)
        count = len(prompt_ids) * sampling.n
        ids = torch.randint(self.vocab_size, (count, sampling.max_new_tokens), generator=generator).tolist()
        logprobs = [[-math.log(self.vocab_size)] * sampling.max_new_tokens] * count
        prompts = [list(p) for p in prompt_ids]
        return Rollout(prompts, ids, logprobs, [False] * count, group_size=sampling.n)

    def load_weights(self, weights, version=None) -> None:
        """Nothing to load."""


@dataclass
class UniformSettings(EngineSettings):
    """The stand-in engine's settings: ``rollout.engine: uniform``."""

    name: ClassVar[str] = "uniform"
    samples_live_policy: ClassVar[bool] = False

    vocab_size: int | None = None
    """Tokens to draw from; None = the tokenizer's vocabulary."""

    def __post_init__(self) -> None:
        if self.vocab_size is not None and self.vocab_size < 2:
            raise ValueError(f"rollout.engine.init_args.vocab_size must be >= 2 or null, got {self.vocab_size}")

    def build(self, module: Any, tokenizer: Any, seed: int, context: EngineContext, *, max_model_len, sequences):
        return UniformEngine(self.vocab_size or len(tokenizer), seed)


register_engine(UniformSettings)  # the one registration: ``rollout.engine: uniform``


def _fit(engine: Any, steps: int = 2):
    module = GRPOModule(model="tiny:chars")
    callback = RolloutCallback(
        engine=engine,
        sampling=SamplingConfig(n=4, max_new_tokens=2),
        rewards=[RewardSpec("prefix_match")],
        weight_sync=WeightSyncSettings(check_every=0),  # no weights, nothing to compare with the policy
        seed=0,
    )
    dm = PromptDataModule(DigitTask(num_train=32, num_val=4), tokenizer_path="tiny:chars", batch_size=4)
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=steps,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(module, datamodule=dm)
    return trainer, callback


def test_a_registered_engine_trains_by_its_short_name_and_by_its_settings(tiny_cache):
    UniformEngine.built.clear()
    trainer, callback = _fit("uniform")
    (engine,) = UniformEngine.built
    assert trainer.global_step == 2 and engine.calls == 2 and callback.engine is None  # closed at teardown
    assert engine.vocab_size == 48  # the tiny chars tokenizer's
    _fit(UniformSettings(vocab_size=5))
    assert [e.vocab_size for e in UniformEngine.built] == [48, 5]


def test_a_new_engine_trains_from_a_recipe_by_its_class_path(tmp_path, tiny_cache):
    engine = {"class_path": f"{__name__}.UniformSettings", "init_args": {"vocab_size": 7}}
    path = write_config(tmp_path, **{"rollout.engine": engine, "rollout.weight_sync": {"check_every": 0}})
    built = cli(["fit", "-c", str(path), "--trainer.max_steps", "2"])
    callback = next(c for c in built.trainer.callbacks if isinstance(c, RolloutCallback))
    assert built.trainer.global_step == 2 and callback.engine_settings == UniformSettings(vocab_size=7)
    assert UniformEngine.built[-1].vocab_size == 7
    saved = yaml.safe_load((tmp_path / "logs" / "run" / "version_0" / "config.yaml").read_text())
    assert saved["rollout"]["init_args"]["engine"] == engine  # the chosen engine's section, nothing else
    assert not {"vllm", "server"} & set(saved["rollout"]["init_args"])


# ------------------------------------------------------------------------------ short names
def test_short_names_are_the_engines_with_their_defaults():
    assert {"hf", "vllm", "vllm_server", "uniform"} <= set(ENGINES.names())
    assert resolve_engine("vllm") == VLLMArgs() and resolve_engine("vllm_server") == ServerSettings()
    assert resolve_engine("hf") == HFSettings()
    given = VLLMArgs(max_model_len=64)
    resolved = resolve_engine(given)
    assert resolved == given and resolved is not given  # a copy: the callback's own


def test_a_second_registration_of_a_name_is_refused():
    with pytest.raises(ValueError, match="rollout engine 'uniform' is already registered"):
        register_engine(UniformSettings)
    with pytest.raises(TypeError, match="register_engine takes an EngineSettings subclass"):
        register_engine(dict)


def test_each_engine_declares_what_it_can_do():
    capabilities = {
        cls.name: (cls.samples_live_policy, cls.async_capable, cls.serves_lora_adapters, cls.runs_vllm_here)
        for cls in (HFSettings, VLLMArgs, ServerSettings)
    }
    assert capabilities == {
        "hf": (True, False, False, False),
        "vllm": (False, False, True, True),
        "vllm_server": (False, True, False, False),
    }
    assert ServerSettings(urls=["http://10.0.0.2:8000"]).server_urls() == ["http://10.0.0.2:8000"]
    assert VLLMArgs().server_urls() == [] and HFSettings().context_limit() == (None, "")
    assert VLLMArgs(max_model_len=64).context_limit() == (64, "rollout.engine.init_args.max_model_len")


# ---------------------------------------------------------------------- device defaults
def test_kv_bytes_per_token_from_the_model_shape():
    assert kv_bytes_per_token(TINY, "float32") == 2 * 2 * 2 * 32 * 4 == 1024
    assert kv_bytes_per_token(SMOLLM2, "float32") == 2 * 30 * 3 * 64 * 4 == 46080
    assert kv_bytes_per_token(SMOLLM2, "bfloat16") == 23040
    assert kv_bytes_per_token({**TINY, "head_dim": 16}, "float32") == 512  # an explicit head_dim wins
    assert kv_bytes_per_token({**TINY, "num_key_value_heads": None}, "float32") == 1024  # none: the heads
    with pytest.raises(
        ValueError, match=r"no num_hidden_layers .*: set rollout.engine.init_args.kv_cache_memory_bytes"
    ):
        kv_bytes_per_token({"hidden_size": 64}, "float32")


def test_cpu_kv_cache_holds_a_generation_at_full_length_with_a_floor():
    # the quickstart: 8 prompts x 8 samples of 7 tokens (one 128-token block each) on the tiny model: 8 MiB -> floor
    assert cpu_kv_cache_bytes(TINY, "float32", 7, 64) == KV_CACHE_FLOOR_BYTES == 64 * MIB
    # SmolLM2 in float32, 64 sequences of 256 tokens: 46080 x 256 x 64 bytes = 720 MiB
    assert cpu_kv_cache_bytes(SMOLLM2, "float32", 256, 64) == 720 * MIB
    # 257 tokens take three blocks of 128: 46080 x 384 x 64 = 1080 MiB; blocks of 32 fit 288 tokens: 810 MiB
    assert cpu_kv_cache_bytes(SMOLLM2, "float32", 257, 64) == 1080 * MIB
    assert cpu_kv_cache_bytes(SMOLLM2, "float32", 257, 64, block_size=32) == 810 * MIB
    # rounded up to a whole MiB: 46080 x 128 x 12 = 67.5 MiB -> 68 MiB
    assert cpu_kv_cache_bytes(SMOLLM2, "float32", 100, 12) == 68 * MIB


def test_default_dtype_follows_the_device(monkeypatch):
    assert default_dtype(cpu=True) == "float32"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert default_dtype(cpu=False) == "bfloat16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert default_dtype(cpu=False) == "float16"


def test_vllm_settings_for_the_device_fill_only_what_is_unset(monkeypatch):
    cpu = VLLMArgs().for_device(True, SMOLLM2, 256, 64)
    assert (cpu.dtype, cpu.kv_cache_memory_bytes, cpu.enforce_eager) == ("float32", 720 * MIB, True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    gpu = VLLMArgs().for_device(False, SMOLLM2, 256, 64)
    assert (gpu.dtype, gpu.kv_cache_memory_bytes) == ("bfloat16", None)  # vLLM sizes it: gpu_memory_utilization
    kept = VLLMArgs(dtype="float16", kv_cache_memory_bytes=3 * MIB).for_device(True, SMOLLM2, 256, 64)
    assert (kept.dtype, kept.kv_cache_memory_bytes) == ("float16", 3 * MIB)
    # half the bytes per token in bfloat16 on CPU, when asked for
    assert VLLMArgs(dtype="bfloat16").for_device(True, SMOLLM2, 256, 64).kv_cache_memory_bytes == 360 * MIB


def test_started_servers_get_the_same_defaults_and_given_servers_no_cache_size():
    started = ServerSettings(max_model_len=256).for_device(True, SMOLLM2, 64)
    assert (started.dtype, started.kv_cache_memory_bytes) == ("float32", 720 * MIB)
    given = ServerSettings(urls=["http://10.0.0.2:8000"], max_model_len=256).for_device(True, {}, 64)
    assert (given.dtype, given.kv_cache_memory_bytes) == ("float32", None)


def test_the_vllm_engine_gets_the_cpu_defaults(monkeypatch, tiny_model_path):
    """`VLLMEngine` on CPU with nothing set: float32, eager, and the KV cache of the rule (the floor here)."""
    import types

    import lightning_grpo.rollout.vllm as vllm_module

    passed = {}
    monkeypatch.setattr(vllm_module, "import_vllm", lambda: types.SimpleNamespace(LLM=lambda **kw: passed.update(kw)))
    monkeypatch.setattr(vllm_module, "is_cpu_platform", lambda: True)
    vllm_module.VLLMEngine(str(tiny_model_path), VLLMArgs(max_model_len=40), sequences=64)
    assert passed["dtype"] == "float32" and passed["enforce_eager"] is True
    assert passed["kv_cache_memory_bytes"] == KV_CACHE_FLOOR_BYTES
    passed.clear()
    monkeypatch.setattr(vllm_module, "is_cpu_platform", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    vllm_module.VLLMEngine(str(tiny_model_path), VLLMArgs(max_model_len=40), sequences=64)
    assert passed["dtype"] == "bfloat16" and "kv_cache_memory_bytes" not in passed
