"""Every shipped recipe (``recipes/*.yaml``): it parses with the CLI, it instantiates, and it trains.

Recipes that name real weights (``model.model`` is a path) run here on the built-in tiny model
and digit task, on the CPU, in float32 (:func:`tiny_substitute`). Training uses the session's one
vLLM engine (``vllm_engine`` in ``conftest.py``) through ``RolloutCallback.use_engine``, or the
HF engine when vLLM is not installed.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import lightning as L
import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]
#: The GRPO recipes (``lightning-grpo fit``); the SFT ones (``sft_*.yaml``, ``lightning-grpo sft fit``): tests/package/test_sft_recipes.py.
RECIPES = sorted(
    p for p in (ROOT / "recipes").glob("*.yaml") if not (p.stem.startswith("sft_") or p.stem.endswith("_sft"))
)
IDS = [p.stem for p in RECIPES]
#: GRPO stages of two-stage recipes on the real Qwen3 tokenizer (``tiny:qwen3``): stage 2 starts from stage 1's run
#: folder, so the pair builds and trains in tests/package/test_qwen3_recipes.py; here their conventions and parsing.
TWO_STAGE = [p for p in RECIPES if p.stem.startswith("qwen3_")]
RUN_RECIPES = [p for p in RECIPES if p not in TWO_STAGE]
HAS_VLLM = importlib.util.find_spec("vllm") is not None
#: Policy losses that report ratio and clip fractions (``ppo``-style).
CLIPPED_LOSSES = {
    "ppo",
    "dual_clip",
    "delta_clip",
    "gspo",
    "gspo_token",
    "cispo",
    "clip_cov",
    "dppo_tv",
    "dppo_kl",
    "geo_mean",
    "reinforce",
}

ROLLOUT_CALLBACKS = {"lightning_grpo.RolloutCallback", "lightning_grpo.AgentRolloutCallback"}
#: The default guard set (lightning_grpo/callbacks/guard_set.py) with its non-default settings, in order.
DEFAULT_GUARDS = [
    ("NonFiniteGuard", {}),
    ("LogProbGuard", {}),
    ("EntropyGuard", {"floor": 0.05, "max_reward": 0.9}),
    ("IdenticalSamplesGuard", {}),
    ("MismatchGuard", {}),
    ("ZeroRewardGuard", {}),
    ("ZeroStdGuard", {"max_reward": 0.9}),
    ("TruncationGuard", {"max_reward": 0.9}),
]


class _Attached(Exception):
    """Raised by :class:`_SeeCallbacks` with the Trainer's callbacks once Lightning attached the module's."""


class _SeeCallbacks(L.Callback):
    def setup(self, trainer, pl_module, stage):  # after Trainer._run attached configure_callbacks()
        raise _Attached(list(trainer.callbacks))


def _attached_callbacks(cfg: dict[str, Any], tmp_path: Path, *args: str) -> list:
    """The callbacks a real Trainer built from recipe ``cfg`` holds when fit starts (it stops there)."""
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(cfg))
    cli = _cli(["-c", str(path), *_run_args(tmp_path, 1), *args])
    cli.trainer.callbacks.insert(0, _SeeCallbacks())
    with pytest.raises(_Attached) as seen:
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return [c for c in seen.value.args[0] if not isinstance(c, _SeeCallbacks)]


def test_the_module_attaches_the_default_guards_unless_the_recipe_names_one(tmp_path, tiny_cache):
    """quickstart.yaml as written: the eight default guards with their settings, once, next to the recipe's
    ModelCheckpoint and RolloutCallback. A recipe that names one guard gets that guard only; with
    ``model.default_guards: false`` it gets none."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    import lightning_grpo
    from lightning_grpo import RolloutCallback
    from lightning_grpo.callbacks.guards import Guard

    cfg = _load(ROOT / "recipes" / "quickstart.yaml")
    attached = _attached_callbacks(cfg, tmp_path)
    guards = [c for c in attached if isinstance(c, Guard)]
    assert [type(g).__name__ for g in guards] == [name for name, _ in DEFAULT_GUARDS]
    for guard, (name, settings) in zip(guards, DEFAULT_GUARDS):  # the state key holds the action and every setting
        assert guard.state_key == getattr(lightning_grpo, name)(**settings).state_key, name
    assert guards[2].floor == 0.05 and guards[2].max_reward == guards[6].max_reward == 0.9
    assert (
        sum(isinstance(c, ModelCheckpoint) for c in attached) == 1
        and sum(isinstance(c, RolloutCallback) for c in attached) == 1
    )

    own = copy.deepcopy(cfg)
    own["trainer"]["callbacks"].append({"class_path": "lightning_grpo.RewardDropGuard"})
    assert [type(c).__name__ for c in _attached_callbacks(own, tmp_path) if isinstance(c, Guard)] == ["RewardDropGuard"]
    none = _attached_callbacks(cfg, tmp_path, "--model.default_guards=false")
    assert [c for c in none if isinstance(c, Guard)] == [] and sum(isinstance(c, ModelCheckpoint) for c in none) == 1


# --------------------------------------------------------------------------------- helpers
def _cli(args: list[str], parse_only: bool = False):
    """The ``lightning-grpo`` CLI (``lightning_grpo.cli.build_cli``) with ``run=False``."""
    from lightning_grpo.cli import GRPOCLI, build_cli

    class ParseOnly(GRPOCLI):
        def instantiate_classes(self) -> None:  # parse and validate, build nothing
            pass

    cls = ParseOnly if parse_only else GRPOCLI
    with mock.patch.object(sys, "argv", ["lightning-grpo"]):  # pytest's own arguments are not ours
        return build_cli(args, run=False, cli_class=cls)


def _policy_args(cfg: dict[str, Any]) -> dict[str, Any]:
    return cfg["model"].get("policy") or {}


def _load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def _rollout_args(cfg: dict[str, Any]) -> dict[str, Any]:
    """The rollout section's options (under ``init_args`` when it names a ``class_path``)."""
    section = cfg["rollout"]
    return section["init_args"] if "class_path" in section else section


#: ``rollout.engine``'s settings classes by the short name they are registered under.
ENGINE_CLASSES = {
    "lightning_grpo.VLLMArgs": "vllm",
    "lightning_grpo.ServerSettings": "vllm_server",
    "lightning_grpo.HFSettings": "hf",
}


def _engine(cfg: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(The engine's short name, its settings as written) of a recipe's ``rollout.engine``."""
    engine = _rollout_args(cfg).get("engine", "vllm")
    if isinstance(engine, str):
        return engine, {}
    return ENGINE_CLASSES[engine["class_path"]], engine.get("init_args") or {}


def _loss_args(cfg: dict[str, Any]) -> dict[str, Any]:
    return cfg["model"]["loss"]["init_args"]


def _is_real_model(cfg: dict[str, Any]) -> bool:
    return not cfg["model"]["model"].startswith("tiny:")  # "tiny:tools": a built-in tiny model


def _weights_present(cfg: dict[str, Any]) -> bool:
    return _is_real_model(cfg) and (ROOT / cfg["model"]["model"]).is_dir()


def tiny_substitute(cfg: dict[str, Any]) -> dict[str, Any]:
    """A real-model recipe moved onto the tiny model, the digit task, the CPU and float32;
    everything else (objective, LoRA, gradient checkpointing, accumulation) is kept."""
    cfg = copy.deepcopy(cfg)
    cfg["model"]["model"] = "tiny:chars"
    cfg["model"].setdefault("policy", {})["dtype"] = "float32"
    data = cfg["data"]
    for key in ("train_files", "val_files", "tokenizer_path"):
        data[key] = None
    data.update(source={"class_path": "lightning_grpo.DigitTask"}, format={})  # the digit task's columns, as plain text
    cfg["trainer"].update(accelerator="cpu", precision="32-true")
    rollout = _rollout_args(cfg)
    rollout["sampling"]["max_new_tokens"] = 4
    if _engine(cfg)[0] == "vllm":  # the engine's defaults on CPU (max_model_len: derived)
        rollout["engine"] = "vllm"
    if "agent" in rollout:  # agent recipes: the digit task's prompts open the episodes
        rollout["agent"]["environment_args"].update(prompt_key="prompt", system_prompt=None)
    return cfg


def _runnable_here(cfg: dict[str, Any]) -> bool:
    """A real-model recipe runs as written only with its weights, its data and a GPU."""
    files = [cfg["data"].get(k) for k in ("train_files", "val_files")]
    data_present = all((ROOT / f).is_file() for f in files if isinstance(f, str))
    return _weights_present(cfg) and data_present and torch.cuda.is_available()


def _teacher_for(path: Path, request) -> str | None:
    """A distillation recipe's teacher when its directory is not there (built by a 1000-step quickstart
    run): the session's supervised digit teacher (tests/helpers/distill.py), same tokenizer."""
    distillation = _load(path)["model"].get("distillation")
    if distillation is None or (ROOT / str(distillation["teacher"])).is_dir():
        return None
    return str(request.getfixturevalue("digit_teacher_path"))


def _prepared(
    path: Path, tmp_path: Path, train: bool = False, teacher: str | None = None
) -> tuple[dict[str, Any], Path]:
    """(config, file to pass to -c): the recipe itself, or a substituted copy in tmp_path.
    Training always moves real-model recipes onto the tiny model (a 3-step smoke test); ``teacher``
    replaces a distillation recipe's teacher."""
    cfg = _load(path)
    changed = False
    if teacher is not None:
        cfg["model"]["distillation"]["teacher"], changed = teacher, True
    if _is_real_model(cfg) and (train or not _runnable_here(cfg)):
        cfg, changed = tiny_substitute(cfg), True
    other_vocabulary = cfg["model"].get("model") in ("tiny:tools", "tiny:text")  # than the session engine's model
    if not HAS_VLLM or (train and other_vocabulary):
        _rollout_args(cfg).update(engine="hf")
        _rollout_args(cfg).pop("max_staleness", None)  # asynchronous rollouts need vLLM servers
        changed = True
    if not changed:
        return cfg, path
    out = tmp_path / path.name
    out.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return cfg, out


def _run_args(tmp_path: Path, max_steps: int) -> list[str]:
    logger = {
        "class_path": "lightning.pytorch.loggers.CSVLogger",
        "init_args": {"save_dir": str(tmp_path), "name": "run"},
    }
    return [
        f"--trainer.max_steps={max_steps}",
        "--trainer.log_every_n_steps=1",
        "--trainer.limit_val_batches=0",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={tmp_path}",
        f"--trainer.logger={json.dumps(logger)}",
    ]


def _shares(path: Path) -> list[pytest.MarkDecorator]:
    """The session fixture a recipe's training test asks for by value: the vLLM server (``engine: vllm_server``)
    or the digit teacher (a distillation recipe whose teacher folder is absent, ``_teacher_for``)."""
    cfg = _load(path)
    distillation = cfg["model"].get("distillation")
    if _engine(cfg)[0] == "vllm_server":
        return [pytest.mark.shares("vllm_server")]
    if distillation is not None and not (ROOT / str(distillation["teacher"])).is_dir():
        return [pytest.mark.shares("digit_teacher_path")]
    return []


#: Recipes on a packaged real model (pypi:...): .ci/run trains smollm2_arithmetic.yaml 2 steps as written, not here (the
#: tiny substitute cannot earn their rewards, so no weight would move).
PACKAGED_MODEL = {p for p in RUN_RECIPES if _load(p)["model"]["model"].startswith("pypi:")}
PARAMS = [pytest.param(p, id=p.stem, marks=_shares(p)) for p in RUN_RECIPES if p not in PACKAGED_MODEL]


# ------------------------------------------------------------------------ (a) parse, build
@pytest.mark.parametrize("path", RECIPES, ids=IDS)
def test_recipe_parses_as_written(path):
    """The file as shipped: every key is a real option of the right type (nothing is built)."""
    config = _cli(["-c", str(path)], parse_only=True).config
    assert config.model.loss.class_path == "lightning_grpo.GRPOLoss"
    assert config.rollout.class_path in ROLLOUT_CALLBACKS
    assert not ROLLOUT_CALLBACKS & {c.class_path for c in config.trainer.callbacks}


@pytest.mark.parametrize("path", RUN_RECIPES, ids=lambda p: p.stem)
def test_recipe_instantiates(path, tmp_path, tiny_cache):
    from lightning_grpo import GRPOLoss, GRPOModule, PromptDataModule, RolloutCallback

    cfg, config_file = _prepared(path, tmp_path)
    cli = _cli(["-c", str(config_file), *_run_args(tmp_path, 1)])
    assert isinstance(cli.model, GRPOModule) and isinstance(cli.model.loss_fn, GRPOLoss)
    assert isinstance(cli.datamodule, PromptDataModule)
    assert sum(isinstance(c, RolloutCallback) for c in cli.trainer.callbacks) == 1
    expected_reference = "none"
    if (_loss_args(cfg).get("kl") or {}).get("beta", 0.0) > 0:
        expected_reference = "adapter" if _policy_args(cfg).get("lora") is not None else "copy"
    assert cli.model.reference_mode == expected_reference
    cli.datamodule.setup("fit")  # tokenizer, data, columns
    assert len(cli.datamodule.train_records) >= cli.datamodule.batch_size


# ---------------------------------------------------------------------- recipe consistency
@pytest.mark.parametrize("path", RECIPES, ids=IDS)
def test_recipe_lengths_agree(path):
    """Lengths written twice in a recipe (YAML cannot reference a value) are equal."""
    cfg = _load(path)
    rollout, loss = _rollout_args(cfg), _loss_args(cfg)
    max_new = rollout.get("sampling", {}).get("max_new_tokens", 16)
    if loss.get("aggregation") == "seq_mean_token_sum_norm":  # Dr. GRPO: L_max = max_new_tokens
        assert loss["aggregation_args"]["max_length"] == max_new
    for reward in rollout.get("rewards") or []:
        if reward["name"] == "soft_overlong":
            assert reward["kwargs"]["max_length"] == max_new
    engine = _engine(cfg)[1]
    prompt = cfg["data"].get("format", {}).get("max_prompt_length") or 5  # the digit task: "4821="
    if engine.get("max_model_len") is not None:  # else derived from the data
        assert engine["max_model_len"] >= prompt + max_new


@pytest.mark.parametrize("path", RECIPES, ids=IDS)
def test_cpu_recipes_kv_cache_holds_a_generation(path, tiny_cache):
    """A CPU recipe's KV cache, set or the default for the device and the model, holds every sequence of one
    generation at the engine's full length (the tiny models' recipes get the default, 64 MiB)."""
    from lightning_grpo.models.tiny import builtin_model_path
    from lightning_grpo.rollout.engine_defaults import (
        CPU_BLOCK_SIZE,
        KV_CACHE_FLOOR_BYTES,
        cpu_kv_cache_bytes,
        kv_bytes_per_token,
        model_config,
    )

    cfg = _load(path)
    name, settings = _engine(cfg)
    model = cfg["model"]["model"]
    if cfg["trainer"].get("accelerator") != "cpu" or name == "hf" or not model.startswith("tiny:"):
        return
    config = model_config(builtin_model_path(model))
    # derived: the tiny tasks' prompt + completion fit one KV block (the quickstart's 7 tokens, reasoning gym's 7)
    length = settings.get("max_model_len") or CPU_BLOCK_SIZE
    sequences = cfg["data"]["batch_size"] * _rollout_args(cfg)["sampling"]["n"]
    size = settings.get("kv_cache_memory_bytes") or cpu_kv_cache_bytes(config, "float32", length, sequences)
    assert size >= kv_bytes_per_token(config, "float32") * length * sequences
    if "kv_cache_memory_bytes" not in settings:
        assert size == KV_CACHE_FLOOR_BYTES


@pytest.mark.parametrize("path", [p for p in RUN_RECIPES if _is_real_model(_load(p))], ids=lambda p: p.stem)
def test_real_model_recipe_settings(path):
    cfg = _load(path)
    data, trainer, policy = cfg["data"], cfg["trainer"], _policy_args(cfg)
    vllm_args = _engine(cfg)[1]
    assert data.get("tokenizer_path") is None, (
        "the policy's own tokenizer and chat template (data.tokenizer_path unset)"
    )
    if trainer["accelerator"] == "cpu":  # a real model on CPU: float32, a KV cache size of its own
        assert vllm_args["dtype"] == policy.get("dtype", "float32") == "float32"
        assert vllm_args["kv_cache_memory_bytes"] > 0
        return
    assert trainer["accelerator"] == "gpu"
    assert vllm_args.get("kv_cache_memory_bytes") is None, "on a GPU the KV cache comes from gpu_memory_utilization"
    assert 0 < vllm_args["gpu_memory_utilization"] < 1
    if policy.get("lora") is not None:
        assert policy["gradient_checkpointing"] is True
    if "fp16" in path.stem:  # trainer and engine both in fp16, with the loss scaler of 16-mixed
        assert vllm_args["dtype"] == policy["dtype"] == "float16" and trainer["precision"] == "16-mixed"
    else:
        assert vllm_args["dtype"] == "bfloat16"
        assert trainer["precision"].startswith("bf16") or policy["dtype"] == "bfloat16"


# ---------------------------------------------------------------------------- (b) training
def _trainable(module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.policy.named_parameters() if p.requires_grad}


@pytest.mark.vllm
@pytest.mark.parametrize("path", PARAMS)
def test_recipe_trains(path, tmp_path, tiny_cache, request):
    from lightning_grpo import RolloutCallback

    cfg, config_file = _prepared(path, tmp_path, train=True, teacher=_teacher_for(path, request))
    steps = 3
    cli = _cli(["-c", str(config_file), *_run_args(tmp_path, steps)])
    trainer, module = cli.trainer, cli.model
    (callback,) = [c for c in trainer.callbacks if isinstance(c, RolloutCallback)]
    if HAS_VLLM and callback.engine_settings.name == "vllm_server":  # the session's server, not a new one
        from lightning_grpo.rollout.server_client import ServerClient
        from lightning_grpo.rollout.server_engine import ServerEngine

        callback.use_engine(ServerEngine([ServerClient(request.getfixturevalue("vllm_server"))]))
    elif HAS_VLLM and callback.engine_settings.name == "vllm":
        callback.use_engine(request.getfixturevalue("vllm_engine"))
    module.configure_model()  # build the policy now to snapshot its weights (fit reuses it)
    before = _trainable(module)

    trainer.fit(module, datamodule=cli.datamodule)

    assert trainer.global_step == steps
    metrics = {k: float(v) for k, v in trainer.logged_metrics.items()}
    assert math.isfinite(metrics["train/loss"]), metrics
    after = _trainable(module)
    moved = max((after[n] - before[n]).abs().max().item() for n in before)
    assert moved > 0, "no trainable weight changed"
    _check_algorithm_metrics(cfg, module, metrics)
    if _engine(cfg)[0] == "vllm" and cfg["model"]["model"] == "tiny:chars":
        _check_engine_checkpoint(module, cli.datamodule.tokenizer)


def _check_engine_checkpoint(module, tokenizer) -> None:
    """The checkpoint the vLLM engine factory writes for a policy without a model path (vLLM
    builds the architecture from it) holds exactly the plain model's weight names. The test
    itself samples with the session engine, so this is the one step of the recipe's own engine
    set-up it does not run."""
    from safetensors import safe_open

    from lightning_grpo.models.weights import policy_weights_for_engine
    from lightning_grpo.rollout.model_dir import _save_for_engine

    directory = Path(_save_for_engine(module.policy, tokenizer))
    try:
        saved: set[str] = set()
        for file in directory.glob("*.safetensors"):
            with safe_open(str(file), "pt") as handle:
                saved |= set(handle.keys())
        expected = {name for name, _ in policy_weights_for_engine(module.policy)}
        assert saved == expected, f"engine checkpoint names differ: {sorted(saved ^ expected)[:6]}"
    finally:
        import shutil

        shutil.rmtree(directory, ignore_errors=True)


def _check_algorithm_metrics(cfg: dict[str, Any], module, metrics: dict[str, float]) -> None:
    """The metrics and rollout-batch properties that the recipe's algorithm must produce."""
    loss, rollout, model = _loss_args(cfg), _rollout_args(cfg), cfg["model"]
    algorithm = model.get("algorithm") or {}
    for key in ("train/reward_mean", "train/frac_reward_zero_std", "train/entropy", "train/kept_groups"):
        assert key in metrics, key
    policy_loss = loss.get("policy_loss", "ppo")
    if policy_loss in CLIPPED_LOSSES:
        for key in ("train/clip_frac_low", "train/clip_frac_high", "train/ratio_mean"):
            assert key in metrics and math.isfinite(metrics[key]), key
    if policy_loss == "clip_cov":  # 0 when no token's covariance falls inside (lb, ub)
        assert 0 <= metrics["train/clip_cov_frac"] <= 1
    if policy_loss == "kl_cov":
        assert 0 < metrics["train/kl_cov_frac"] <= 1  # at least one token is always chosen
    if (loss.get("kl") or {}).get("beta", 0.0) > 0:
        assert math.isfinite(metrics["train/kl"]) and metrics["train/kl"] >= 0
        if _policy_args(cfg).get("lora") is not None:
            assert module.reference is None  # the adapter-disabled policy is the reference
        else:
            assert module.reference is not None
    else:
        assert "train/kl" not in metrics and module.reference is None
    if policy_loss == "sapo":
        assert 0 < metrics["train/gate_weight_mean"] <= 1
    batch = module.rollout_batch
    if (loss.get("off_policy") or {}).get("bypass"):  # old = the engine's log-probs: no trainer pass
        assert batch.old_logp is None and "train/mismatch_k3" not in metrics
    elif algorithm.get("steps_per_generation", 1) > 1 or algorithm.get("num_iterations", 1) > 1:
        assert batch.old_logp is not None
        # the last step trains on a batch sampled two optimizer steps earlier: off-policy
        assert metrics["train/ratio_max"] != 1.0 or metrics["train/ratio_min"] != 1.0
    selection = rollout.get("selection") or {}
    if selection.get("dynamic_sampling"):
        rounds = metrics["train/generation_rounds"]
        assert 1 <= rounds <= selection.get("max_generation_rounds", 4)
        assert 0 <= metrics["train/kept_groups"] <= cfg["data"].get("batch_size", 8)
    if selection.get("gfpo_keep") is not None:
        assert batch.group_size == selection["gfpo_keep"] < rollout["sampling"]["n"]
        assert len(batch) == batch.group_size * cfg["data"].get("batch_size", 8)
    if algorithm.get("advantage") == "qae":
        # the baseline is one of the group's rewards: in every group some advantage is exactly 0
        groups = batch.advantages.view(-1, batch.group_size)
        assert bool((groups == 0).any(dim=1).all()), groups
    for name in (loss.get("off_policy") or {}).get("rejection") or {}:
        assert 0 <= metrics[f"train/rejection/{name}_masked_frac"] <= 1
    if model.get("distillation") is not None:  # token advantages from the teacher
        assert batch.teacher_logp is not None and batch.advantages.shape == batch.completion_mask.shape
        assert math.isfinite(metrics["train/distill_reverse_kl"])
        if model["distillation"].get("gkd_coef", 0.0) > 0:
            assert metrics["train/gkd_jsd"] >= 0
    for reward in rollout.get("rewards") or []:
        assert f"train/reward/{reward.get('alias') or reward['name']}/mean" in metrics
