"""The built-in tiny models' initial weights follow the run's seed (``seed_everything``): each seed of a
seed table starts from its own initialisation, seed 0 from the weights (and cache folder) it always had;
``tiny:<variant>@<seed>`` pins the initialisation; the tokenizer never depends on the seed."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
from safetensors.torch import load_file

from lightning_grpo import GRPOModule, PromptDataModule
from lightning_grpo.data.tasks import DigitTask
from lightning_grpo.models.tiny import builtin_model_path
from tests.helpers.bad_input import cli, write_config

pytestmark = pytest.mark.usefixtures("tiny_cache")
#: The pinned cache keys of the seed-0 built-in models: seed-0 runs reproduce to the digit.
SEED0_KEYS = {"chars": "18e023254e94", "tools": "f1b7e31fcb62", "text": "1aebf6b243b8"}


def _weights(folder: str | Path) -> dict:
    return load_file(Path(folder) / "model.safetensors")


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)


def test_each_seed_has_its_own_initialisation_and_seed_0_keeps_its_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)  # no seed set: seed 0
    for variant, key in SEED0_KEYS.items():
        assert Path(builtin_model_path(f"tiny:{variant}")).name == f"tiny-qwen2-{key}"
    seed0 = builtin_model_path("tiny:chars")
    L.seed_everything(1)
    seed1 = builtin_model_path("tiny:chars")
    assert seed1 != seed0 and not _same(_weights(seed1), _weights(seed0))
    monkeypatch.setenv("LIGHTNING_GRPO_CACHE", str(tmp_path))  # built again from nothing: the same weights
    rebuilt = builtin_model_path("tiny:chars")
    assert Path(rebuilt).name == Path(seed1).name and _same(_weights(rebuilt), _weights(seed1))
    L.seed_everything(0)
    assert Path(builtin_model_path("tiny:chars")).name == Path(seed0).name


def test_the_command_line_seed_picks_the_initialisation_the_policy_and_the_engine_load(tmp_path, monkeypatch):
    """``seed_everything: 1`` in a recipe: the module, its loaded policy and the rollout engine's folder
    are the seed-1 initialisation; the data reads the policy's tokenizer from that folder."""
    from lightning_grpo.rollout.model_dir import engine_model_dir

    monkeypatch.setenv("PL_GLOBAL_SEED", "0")  # restored afterwards: the CLI sets it
    path = write_config(tmp_path, seed_everything=1)
    run = cli(["-c", str(path)], run=False)
    assert run.model.model_source == builtin_model_path("tiny:chars@1") != builtin_model_path("tiny:chars@0")
    run.trainer.fit(run.model, datamodule=run.datamodule)
    assert run.trainer.global_step == 1 and run.model.model_source == builtin_model_path("tiny:chars@1")
    assert engine_model_dir(run.model, None) == (run.model.model_source, False)  # the folder itself, not a copy
    assert run.datamodule.tokenizer_source == run.model.model_source  # the policy's own (the same for every seed)
    fresh = GRPOModule(model="tiny:chars")
    fresh.configure_model()
    assert _same({k: v for k, v in fresh.policy.state_dict().items()}, _weights(builtin_model_path("tiny:chars@1")))


def test_a_pinned_initialisation_ignores_the_run_seed_and_a_bad_name_is_one_error(monkeypatch):
    monkeypatch.setenv("PL_GLOBAL_SEED", "5")
    pinned = GRPOModule(model="tiny:tools@3").model_source
    assert Path(pinned).name != f"tiny-qwen2-{SEED0_KEYS['tools']}"
    monkeypatch.setenv("PL_GLOBAL_SEED", "3")
    assert builtin_model_path("tiny:tools") == pinned
    assert PromptDataModule(DigitTask(), tokenizer_path="tiny:tools@3").tokenizer_path.endswith(SEED0_KEYS["tools"])
    for bad in ("tiny:chars@x", "tiny:chars@-1", "tiny:words", "tiny:"):
        with pytest.raises(
            ValueError, match=rf"^model.model: '{bad}' is not a built-in tiny model; expected 'tiny:<variant>'"
        ):
            GRPOModule(model=bad)
    with pytest.raises(ValueError, match=r"^data.tokenizer_path: 'tiny:tools@' is not a built-in tiny model"):
        PromptDataModule(DigitTask(), tokenizer_path="tiny:tools@")


def test_the_model_is_required_and_the_tiny_model_is_named():
    """No default model: None is one error naming model.model and the built-in names; "tiny:chars" is one of them."""
    from lightning_grpo import SFTModule

    for cls in (GRPOModule, SFTModule):
        with pytest.raises(
            ValueError, match=r"^model.model is required: .*built-in tiny model by name \(tiny:chars, tiny:tools, "
        ):
            cls(model=None)
    assert GRPOModule(model="tiny:chars").model_source == builtin_model_path("tiny:chars")
