"""Shared helpers of the bad-input tests (tests/checks/test_bad_input.py, tests/checks/test_bad_input_fit.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from unittest import mock

import lightning as L
import pytest
import yaml

from lightning_grpo import (
    GRPOModule,
    PromptDataModule,
    RewardSpec,
    RolloutCallback,
    SamplingConfig,
    ServerSettings,
    VLLMArgs,
)
from lightning_grpo.data.tasks import DigitTask

ROWS = [{"prompt": "12=", "answer": "3"}, {"prompt": "4821=", "answer": "2"}]
#: Command-line options that switch a recipe to engine hf.
HF_ENGINE = ["--rollout.engine=hf"]


# ------------------------------------------------------------------------------------ helpers
class Sentinel(L.Callback):
    """Records whether training got as far as its first hook."""

    started = False

    def on_train_start(self, trainer, pl_module):
        self.started = True


#: The KV cache of the CPU engines the tests build (64 MiB; vLLM's own default on CPU is most of a NUMA node).
CPU_KV_CACHE = 64 * 1024**2


def cpu_vllm(**kwargs) -> VLLMArgs:
    """`VLLMArgs` with the tests' CPU KV cache."""
    return VLLMArgs(**{"kv_cache_memory_bytes": CPU_KV_CACHE, **kwargs})


def cpu_server(**kwargs) -> ServerSettings:
    """`ServerSettings` with the tests' CPU KV cache (servers started here)."""
    return ServerSettings(**{"kv_cache_memory_bytes": CPU_KV_CACHE, **kwargs})


def hf_callback(**kwargs) -> RolloutCallback:
    """A RolloutCallback (engine hf unless given; "vllm" / "vllm_server" get the CPU KV cache)."""
    kwargs.setdefault("sampling", SamplingConfig(n=4, max_new_tokens=3))
    engine = kwargs.pop("engine", "hf")
    engine = (
        {"vllm": cpu_vllm, "vllm_server": cpu_server}.get(engine, lambda: engine)()
        if isinstance(engine, str)
        else engine
    )
    return RolloutCallback(engine=engine, rewards=[RewardSpec("prefix_match")], seed=0, **kwargs)


def fit_error(error: type[Exception], match: str, *, module=None, callback=None, dm=None, **trainer_kwargs) -> None:
    """``trainer.fit`` raises ``error`` matching ``match`` before anything trains or is built."""
    module = module if module is not None else GRPOModule(model="tiny:chars")
    callback = callback if callback is not None else hf_callback()
    sentinel = Sentinel()
    loaded = module.policy is not None
    trainer = L.Trainer(
        max_steps=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[callback, sentinel],
        **trainer_kwargs,
    )
    with pytest.raises(error, match=match):
        trainer.fit(module, datamodule=dm if dm is not None else PromptDataModule(DigitTask(), batch_size=4))
    assert not sentinel.started and callback.engine is None and trainer.global_step == 0
    assert loaded or module.policy is None, "the policy was loaded: the error came too late"


def cli(args: list[str], run: bool = True):
    from lightning_grpo.cli import build_cli

    with mock.patch.object(sys, "argv", ["lightning-grpo"]):
        return build_cli(args, run=run)


def write_config(tmp_path: Path, **overrides) -> Path:
    """A small HF-engine recipe (YAML) with ``overrides`` applied as dotted keys."""
    cfg = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu",
            "max_steps": 1,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "limit_val_batches": 0,
            "default_root_dir": str(tmp_path / "root"),
            "logger": {
                "class_path": "lightning.pytorch.loggers.CSVLogger",
                "init_args": {"save_dir": str(tmp_path / "logs"), "name": "run"},
            },
        },
        "rollout": {"engine": "hf", "sampling": {"n": 4, "max_new_tokens": 3}},
        "model": {"model": "tiny:chars", "algorithm": {"advantage": "grpo"}},
        "data": {"source": {"class_path": "lightning_grpo.DigitTask"}, "batch_size": 4},
    }
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = cfg
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        node[leaf] = value
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path
