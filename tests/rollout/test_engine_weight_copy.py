"""engine='vllm' (and 'vllm_server' with servers started here) with an in-memory policy: the weight copy saved
for vLLM to load is removed when the engine is closed (the callback's teardown, or an error / Ctrl-C stopping
the run), and when the engine fails to start. vLLM itself is replaced by a stand-in (the folder's life is the
package's, not vLLM's)."""

from __future__ import annotations

import tempfile
import types
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

import lightning_grpo.rollout.vllm as vllm_module
from lightning_grpo import DigitTask, GRPOModule, PromptDataModule
from lightning_grpo.core.batch import BatchGeometry
from lightning_grpo.plan.run_plan import RunPlan
from lightning_grpo.rollout.engine_settings import EngineContext
from lightning_grpo.rollout.vllm_args import VLLMArgs
from lightning_grpo.rollout.vllm_server import ServerSettings
from tests.helpers.bad_input import hf_callback


class _StandInLLM:
    """Stands in for vllm.LLM: checks that the weight copy is there while it loads, and shuts down."""

    fail = False

    def __init__(self, **kwargs):
        assert (Path(kwargs["model"]) / "config.json").is_file()
        if self.fail:
            raise RuntimeError("vLLM failed to start")
        self.llm_engine = types.SimpleNamespace(engine_core=types.SimpleNamespace(shutdown=lambda: None))


@pytest.fixture
def temp_dir(tmp_path, monkeypatch):
    """tempfile's folder is tmp_path, the only place the weight copy can be."""
    monkeypatch.setattr(vllm_module, "import_vllm", lambda: types.SimpleNamespace(LLM=_StandInLLM))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def _copies(folder: Path) -> list[Path]:
    return sorted(folder.glob("lightning-grpo-engine-*"))


def _module_and_tokenizer(tiny_model_path):
    module = GRPOModule(model=AutoModelForCausalLM.from_pretrained(tiny_model_path))
    return module, AutoTokenizer.from_pretrained(tiny_model_path)


def _build(tiny_model_path):
    module, tokenizer = _module_and_tokenizer(tiny_model_path)
    return VLLMArgs(max_model_len=64).build(module, tokenizer, 0, EngineContext(), max_model_len=None, sequences=1)


def test_the_weight_copy_is_removed_when_the_engine_closes(temp_dir, tiny_model_path):
    engine = _build(tiny_model_path)
    (copy,) = _copies(temp_dir)
    assert (copy / "config.json").is_file()
    engine.close()
    assert _copies(temp_dir) == []


def test_the_weight_copy_is_removed_when_the_engine_fails_to_start(temp_dir, tiny_model_path, monkeypatch):
    monkeypatch.setattr(_StandInLLM, "fail", True)
    with pytest.raises(RuntimeError, match="vLLM failed to start"):
        _build(tiny_model_path)
    assert _copies(temp_dir) == []


def test_an_interrupted_run_closes_the_engine_and_removes_the_copy(temp_dir, tiny_model_path):
    module, tokenizer = _module_and_tokenizer(tiny_model_path)
    data = PromptDataModule(DigitTask(), tokenizer_path=str(tiny_model_path))
    data.tokenizer = tokenizer  # what the callback reads to build the engine
    trainer = types.SimpleNamespace(global_rank=0, world_size=1, log_dir=str(temp_dir), datamodule=data)
    callback = hf_callback(engine=VLLMArgs(max_model_len=64))
    plan = RunPlan(  # what the callback reads from its plan to build the engine
        context_length=64,
        geometry=BatchGeometry(prompts=4),
        seed=0,
        sampling_seed=0,
        tokenizer_source=None,
        engine_settings=callback.engine_settings,
    )
    callback.use_plan(plan)
    callback.setup(trainer, module, "fit")
    callback.ensure_engine(trainer, module)
    assert len(_copies(temp_dir)) == 1
    callback.on_exception(trainer, module, KeyboardInterrupt())
    assert callback.engine is None and _copies(temp_dir) == []


@pytest.mark.parametrize("fails", [False, True], ids=["closed", "failed_to_start"])
def test_started_servers_weight_copy_is_removed_too(temp_dir, tiny_model_path, monkeypatch, fails):
    def start_servers(model_dir, *args, **kwargs):
        assert (Path(model_dir) / "config.json").is_file()
        if fails:
            raise RuntimeError("the server did not start")
        return [types.SimpleNamespace(url="http://127.0.0.1:1", stop=lambda: None)]

    monkeypatch.setattr("lightning_grpo.rollout.server_process.start_servers", start_servers)
    module, tokenizer = _module_and_tokenizer(tiny_model_path)
    settings, context = ServerSettings(max_model_len=64), EngineContext(log_dir=str(temp_dir / "logs"))
    if fails:
        with pytest.raises(RuntimeError, match="the server did not start"):
            settings.build(module, tokenizer, 0, context, max_model_len=None, sequences=1)
    else:
        engine = settings.build(module, tokenizer, 0, context, max_model_len=None, sequences=1)
        assert len(_copies(temp_dir)) == 1
        engine.close()
    assert _copies(temp_dir) == []
