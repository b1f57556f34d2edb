"""Bad input: every case fails with ONE clear error that names the field or file and what was
expected, before training starts, with nothing written (no run directory, no checkpoint).

Fit-level cases run ``trainer.fit`` on the built-in tiny model and digit task with the HF engine
and check that the error came before the policy was loaded, an engine was built or a training
step ran (:func:`fit_error`).
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import sys
from pathlib import Path
from unittest import mock

import lightning as L
import pytest
import torch
import yaml

from lightning_grpo import GRPOLoss, GRPOModule, LoraSettings, PromptDataModule, RewardSpec, RolloutCallback, SamplingConfig
from lightning_grpo.core import ADVANTAGES, REWARD_AGGREGATIONS
from lightning_grpo.data.reward_set import RewardError, RewardSet

ROWS = [{"prompt": "12=", "answer": "3"}, {"prompt": "4821=", "answer": "2"}]


@pytest.fixture(autouse=True)
def tiny_cache(tiny_model_path, monkeypatch):
    """The package's tiny model and tokenizer come from the session's copy (no ~/.cache)."""
    monkeypatch.setenv("LIGHTNING_GRPO_CACHE", str(Path(tiny_model_path).parent))


# ------------------------------------------------------------------------------------ helpers
class Sentinel(L.Callback):
    """Records whether training got as far as its first hook."""

    started = False

    def on_train_start(self, trainer, pl_module):
        self.started = True


def hf_callback(**kwargs) -> RolloutCallback:
    kwargs.setdefault("sampling", SamplingConfig(n=4, max_new_tokens=3))
    return RolloutCallback(engine=kwargs.pop("engine", "hf"), rewards=[RewardSpec("prefix_match")], seed=0, **kwargs)


def fit_error(error: type[Exception], match: str, *, module=None, callback=None, dm=None, **trainer_kwargs) -> None:
    """``trainer.fit`` raises ``error`` matching ``match`` before anything trains or is built."""
    module = module if module is not None else GRPOModule()
    callback = callback if callback is not None else hf_callback()
    sentinel = Sentinel()
    loaded = module.policy is not None
    trainer = L.Trainer(
        max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, callbacks=[callback, sentinel], **trainer_kwargs,
    )  # fmt: skip
    with pytest.raises(error, match=match):
        trainer.fit(module, datamodule=dm if dm is not None else PromptDataModule(batch_size=4))
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
            "accelerator": "cpu", "max_steps": 1, "enable_progress_bar": False, "enable_model_summary": False,
            "limit_val_batches": 0, "default_root_dir": str(tmp_path / "root"),
            "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger",
                       "init_args": {"save_dir": str(tmp_path / "logs"), "name": "run"}},
            "callbacks": [{"class_path": "lightning_grpo.RolloutCallback",
                           "init_args": {"engine": "hf", "sampling": {"n": 4, "max_new_tokens": 3}}}],
        },
        "model": {"advantage": "grpo"},
        "data": {"batch_size": 4},
    }  # fmt: skip
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = cfg
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[leaf] = value
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


# =============================================================== 1. unknown variant names
@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: GRPOLoss(policy_loss="ppoo"), r"unknown policy loss 'ppoo'; valid names: .*\bcispo\b.*\bppo\b"),
        (lambda: GRPOLoss(aggregation="token_meen"), r"unknown loss aggregation 'token_meen'; valid names: .*\btoken_mean\b"),
        (lambda: GRPOLoss(kl_estimator="k4"), r"unknown KL estimator 'k4'; valid names: .*\bk1\b.*\bk3\b"),
        (lambda: GRPOLoss(correction="tis"), r"unknown rollout correction 'tis'; valid names: .*\btis_token\b"),
        (lambda: GRPOModule(advantage="grpoo"), r"unknown advantage estimator 'grpoo'; valid names: .*\bdr_grpo\b.*\bgrpo\b"),
        (lambda: GRPOModule(reward_aggregation="sum"), r"unknown multi-reward aggregation 'sum'; valid names: .*\bsum_then_normalize\b"),
        (lambda: hf_callback(gfpo_keep=2, gfpo_metric="shortest"), r"unknown sample selection 'shortest'; valid names: .*\bgfpo_length\b"),
        (lambda: RewardSet([RewardSpec("exact")]), r"unknown reward function 'exact'; registered: exact_match, .*or give an import path"),
    ],
    ids=["policy_loss", "aggregation", "kl_estimator", "correction", "advantage", "reward_aggregation", "gfpo_metric", "reward"],
)
def test_unknown_variant_name_lists_the_valid_ones(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_unknown_engine_name_fails_at_fit_setup():
    fit_error(ValueError, r"RolloutCallback.engine: unknown rollout engine 'vlm'; valid names: hf, vllm", callback=hf_callback(engine="vlm"))


# ================================================================ 2. YAML (LightningCLI)
@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("model.num_iterations", "abc", r'Parser key "model.num_iterations":\s+Expected a <class \'int\'>. Got value: abc'),
        ("data.batch_size", "two", r'Parser key "data.batch_size":\s+Expected a <class \'int\'>. Got value: two'),
        ("model.dtype", "fp32", r'Parser key "model.dtype":\s+Expected a typing.Literal\[.*float32.*Got value: fp32'),
    ],
    ids=["num_iterations_abc", "batch_size_two", "dtype_literal"],
)
def test_yaml_wrong_type_names_the_field(tmp_path, capsys, key, value, message):
    path = write_config(tmp_path, **{key: value})
    with pytest.raises(SystemExit) as exit_info:
        cli(["fit", "-c", str(path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err[-600:]
    assert not (tmp_path / "logs").exists()


def test_yaml_unknown_key_names_it(tmp_path, capsys):
    path = write_config(tmp_path, **{"model.advantag": "grpo"})
    with pytest.raises(SystemExit):
        cli(["fit", "-c", str(path)])
    assert "advantag" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"trainer.callbacks.0.init_args.sampling": {"n": 1, "max_new_tokens": 3}},
         r"RolloutCallback.sampling.n=1 leaves 1 completion per prompt, but model.advantage='grpo'"),
        ({"model.optimizer": {"class_path": "torch.optim.AdamW", "init_args": {"lr": -0.01}}},
         r"model.optimizer: AdamW rejected its arguments: Invalid learning rate: -0.01"),
        ({"data.train_dataset": [{"question": "12="}]},
         r"prompt_column 'prompt' not found in train_dataset; columns present: \['question'\]"),
    ],
    ids=["group_of_one", "negative_lr", "missing_column"],
)
def test_bad_config_writes_no_run_directory(tmp_path, overrides, message):
    """Options wrong only in combination, or data that does not fit them, fail in the fit's
    set-up before the logger creates its run directory: no version_0, no metrics.csv, no
    config.yaml, no checkpoint."""
    path = write_config(tmp_path, **overrides)
    with pytest.raises(ValueError, match=message):
        cli(["fit", "-c", str(path)])
    assert not (tmp_path / "logs").exists(), sorted(p.name for p in (tmp_path / "logs").rglob("*"))
    assert not (tmp_path / "root").exists()  # no checkpoint directory either


# ================================================================================ 3. data
def test_missing_prompt_column_lists_the_columns(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text('{"q": "12=", "a": "3"}\n')
    dm = PromptDataModule(train_files=str(path), batch_size=1)
    with pytest.raises(ValueError, match=rf"prompt_column 'prompt' not found in train_files {path}; columns present: \['q', 'a'\]"):
        dm.setup("fit")


def test_empty_dataset():
    with pytest.raises(ValueError, match=r"^train_dataset holds no rows$"):
        PromptDataModule(train_dataset=[], batch_size=1).setup("fit")


def test_empty_file(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match=r"train_files: .*empty.jsonl is empty \(holds no rows\)"):
        PromptDataModule(train_files=str(tmp_path / "empty.jsonl"))


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=rf"train_files: file not found: {tmp_path}/missing.jsonl"):
        PromptDataModule(train_files=str(tmp_path / "missing.jsonl"))


def test_fewer_prompts_than_batch_size_at_fit():
    fit_error(ValueError, r"train_dataset holds 2 prompts, fewer than batch_size=4", dm=PromptDataModule(train_dataset=ROWS, batch_size=4))


def test_batch_size_zero():
    with pytest.raises(ValueError, match=r"batch_size must be a positive integer, got 0"):
        PromptDataModule(batch_size=0)


def test_prompt_longer_than_max_errors():
    dm = PromptDataModule(train_dataset=ROWS, batch_size=1, max_prompt_length=4)
    with pytest.raises(ValueError, match=r"prompt 1 of train_dataset has 5 tokens, more than max_prompt_length=4 \(set on_long_prompt='truncate'"):
        dm.setup("fit")


def test_prompt_longer_than_max_truncates_with_a_warning():
    dm = PromptDataModule(train_dataset=ROWS, batch_size=1, max_prompt_length=4, on_long_prompt="truncate")
    with pytest.warns(UserWarning, match=r"truncated 1 of 2 prompts of train_dataset to their last 4 tokens \(max_prompt_length\)"):
        dm.setup("fit")
    assert [len(r["prompt_ids"]) for r in dm.train_records] == [3, 4]


def _tokenizer_copy(tiny_model_path, tmp_path, edit) -> Path:
    """The tiny model's tokenizer files with ``edit(tokenizer_config)`` applied."""
    out = tmp_path / "tokenizer"
    shutil.copytree(tiny_model_path, out)
    (out / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((out / "tokenizer_config.json").read_text())
    edit(config)
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def test_tokenizer_without_chat_template_says_what_to_do(tiny_model_path, tmp_path):
    plain = _tokenizer_copy(tiny_model_path, tmp_path, lambda c: c.pop("chat_template", None))
    dm = PromptDataModule(train_dataset=ROWS, tokenizer_path=str(plain), use_chat_template=True, batch_size=1)
    with pytest.raises(ValueError, match=rf"the tokenizer at {plain} has no chat template: set data.use_chat_template: false .* data.tokenizer_path"):
        dm.setup("fit")


def test_tokenizer_without_eos(tiny_model_path, tmp_path):
    no_eos = _tokenizer_copy(tiny_model_path, tmp_path, lambda c: c.update(eos_token=None))
    dm = PromptDataModule(train_dataset=ROWS, tokenizer_path=str(no_eos), batch_size=1)
    with pytest.raises(ValueError, match=rf"the tokenizer at {no_eos} \(data.tokenizer_path\) has no EOS token, so no completion could end"):
        dm.setup("fit")


def test_tokenizer_vocabulary_larger_than_the_policy(tiny_model_path, tmp_path):
    small = tmp_path / "small-vocab"
    small.mkdir()
    config = json.loads((Path(tiny_model_path) / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**config, "vocab_size": 8}))
    fit_error(ValueError, r"data.tokenizer_path \(.*\) has \d+ tokens but the policy \(.*small-vocab\) has 8 embedding rows: set data.tokenizer_path", module=GRPOModule(model=str(small)))


# ============================================================================= 4. rewards
def raises_on_bad(completions, **_columns):
    return [1.0 / (0.0 if c == "bad" else 1.0) for c in completions]


def too_few(completions, **_columns):
    return [1.0]


def words(completions, **_columns):
    return ["yes" for _ in completions]


def nan_reward(completions, **_columns):
    return [float("nan") for _ in completions]


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (raises_on_bad, r"reward function 'raises_on_bad' raised ZeroDivisionError: float division by zero on sample 1 \(completion 'bad'\)"),
        (too_few, r"reward function 'too_few' returned the wrong number of scores: expected 2, got 1"),
        (words, r"reward function 'words' returned a non-number 'yes' \(str\) at index 0 \(completion 'ok'\)"),
        (nan_reward, r"reward function 'nan_reward' returned nan at index 0 \(completion 'ok'\); scores must be finite"),
    ],
    ids=["raises", "wrong_length", "non_number", "nan"],
)
def test_bad_reward_function(fn, message):
    with pytest.raises(RewardError, match=message):
        RewardSet([RewardSpec(fn)]).score(["ok", "bad"])


def test_reward_on_timeout_invalid():
    with pytest.raises(ValueError, match=r"reward 'exact_match': on_timeout must be 'raise' or 'zero', got 'skip'"):
        RewardSpec("exact_match", on_timeout="skip")


def test_reward_unknown_kwarg_lists_the_parameters():
    with pytest.raises(ValueError, match=r"reward 'regex_format': unknown kwargs \['patern'\]; its named parameters are \['match', 'pattern'\]"):
        RewardSet([RewardSpec("regex_format", kwargs={"patern": r"\d"})])


def test_reward_weights_length_mismatch():
    with pytest.raises(ValueError, match=r"weights must have shape \[R\]=\(2,\), got \(3,\)"):
        REWARD_AGGREGATIONS.get("sum_then_normalize")(torch.zeros(4, 2), [1.0, 1.0, 1.0], 2)


# =========================================================================== 5. groups
def test_group_of_one_with_std_normalisation_in_core():
    with pytest.raises(ValueError, match=r"advantage 'grpo' divides by the std of each group's rewards, which needs group_size >= 2 .* got group_size=1"):
        ADVANTAGES.get("grpo")(torch.tensor([1.0, 0.0]), 1)


def test_group_of_one_with_grpo_at_fit_start():
    fit_error(ValueError, r"RolloutCallback.sampling.n=1 leaves 1 completion per prompt, but model.advantage='grpo' .*normalised by their reward std.*: set RolloutCallback.sampling.n >= 2",
              callback=hf_callback(sampling=SamplingConfig(n=1, max_new_tokens=3)))  # fmt: skip


def test_gfpo_keep_one_at_fit_start():
    fit_error(ValueError, r"RolloutCallback.gfpo_keep=1 leaves 1 completion per prompt, but model.advantage='dr_grpo' .*every advantage would be 0",
              module=GRPOModule(advantage="dr_grpo"), callback=hf_callback(gfpo_keep=1))  # fmt: skip


def test_gfpo_keep_not_below_n():
    with pytest.raises(ValueError, match=r"gfpo_keep must be in \[1, sampling.n\) = \[1, 4\), got 4"):
        hf_callback(gfpo_keep=4)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "qae"])
def test_batch_not_divisible_by_group_size(name):
    with pytest.raises(ValueError, match=r"batch size B=5 is not divisible by group_size=2"):
        ADVANTAGES.get(name)(torch.zeros(5), 2)


def test_dynamic_sampling_filter_batch_not_divisible():
    from lightning_grpo.core import SELECTIONS

    with pytest.raises(ValueError, match=r"batch size B=3 is not divisible by group_size=2"):
        SELECTIONS.get("dynamic_sampling")(torch.zeros(3), 2)


def test_more_steps_per_generation_than_completions():
    fit_error(ValueError, r"model.steps_per_generation=8 x trainer.accumulate_grad_batches=2 training steps share each generation batch of "
              r"data.batch_size=1 x RolloutCallback.sampling.n=4 = 4 completions: some steps would get none",
              module=GRPOModule(steps_per_generation=8), dm=PromptDataModule(batch_size=1), accumulate_grad_batches=2)  # fmt: skip


# ============================================================================= 6. engines
def test_vllm_not_installed_names_the_extra(monkeypatch):
    from lightning_grpo.rollout.vllm import import_vllm

    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ImportError, match=r"engine='vllm' needs vLLM: pip install 'lightning-grpo\[cpu\]' \(CPU\) or 'lightning-grpo\[gpu\]'"):
        import_vllm()


def test_vllm_not_installed_fails_at_fit_setup(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    fit_error(ImportError, r"needs vLLM: pip install 'lightning-grpo\[cpu\]'.*; or set RolloutCallback.engine: hf", callback=hf_callback(engine="vllm"))


def test_max_new_tokens_beyond_vllm_max_model_len(monkeypatch):
    monkeypatch.setattr("lightning_grpo.validation._vllm_installed", lambda: True)  # the check needs no engine
    callback = hf_callback(engine="vllm", sampling=SamplingConfig(n=4, max_new_tokens=10), vllm_args={"max_model_len": 12})
    fit_error(ValueError, r"data.max_prompt_length \(6 tokens\) \+ RolloutCallback.sampling.max_new_tokens \(10\) = 16 tokens exceeds "
              r"RolloutCallback.vllm_args.max_model_len \(12\)", callback=callback, dm=PromptDataModule(batch_size=4, max_prompt_length=6))  # fmt: skip


def test_max_new_tokens_beyond_default_max_model_len(monkeypatch):
    monkeypatch.setattr("lightning_grpo.validation._vllm_installed", lambda: True)
    callback = hf_callback(engine="vllm", sampling=SamplingConfig(n=4, max_new_tokens=510))
    fit_error(ValueError, r"the longest prompt of the data \(data.max_prompt_length is not set\) \(5 tokens\) \+ "
              r"RolloutCallback.sampling.max_new_tokens \(510\) = 515 tokens exceeds RolloutCallback.vllm_args.max_model_len \(default\) \(512\)",
              callback=callback)  # fmt: skip


def test_max_new_tokens_beyond_hf_policy_positions():
    fit_error(ValueError, r"\+ RolloutCallback.sampling.max_new_tokens \(600\) = 605 tokens exceeds the policy's max_position_embeddings \(engine 'hf'\) \(512\)",
              callback=hf_callback(sampling=SamplingConfig(n=4, max_new_tokens=600)))  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dtype": "fp32"}, r"VLLMEngine dtype must be one of \['bfloat16', 'float16', 'float32'\], got 'fp32'"),
        ({"weight_push": "copy"}, r"VLLMEngine weight_push must be one of auto, reload, inplace; got 'copy'"),
    ],
    ids=["dtype", "weight_push"],
)
def test_vllm_engine_bad_argument(monkeypatch, tiny_model_path, kwargs, message):
    from lightning_grpo.rollout.vllm import VLLMEngine

    monkeypatch.setitem(sys.modules, "vllm", None)  # rejected before vLLM is even imported
    with pytest.raises(ValueError, match=message):
        VLLMEngine(str(tiny_model_path), **kwargs)


def test_vllm_args_with_hf_engine():
    fit_error(ValueError, r"RolloutCallback.vllm_args \['max_model_len'\] are for engine 'vllm', but RolloutCallback.engine is 'hf'",
              callback=hf_callback(vllm_args={"max_model_len": 64}))  # fmt: skip


def test_hf_engine_without_eos(tiny_model_path):
    from transformers import AutoModelForCausalLM

    from lightning_grpo.rollout.hf import HFEngine

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    with pytest.raises(ValueError, match=r"HFEngine eos_token_id must be the tokenizer's EOS token id \(an int\), got None"):
        HFEngine(model, eos_token_id=None, pad_token_id=0)
    assert HFEngine(model, eos_token_id=2, pad_token_id=None).pad_token_id == 2  # no pad token: pad with EOS


# ================================================================ 7. incompatible options
def test_lora_sync_adapter_without_enable_lora(monkeypatch):
    monkeypatch.setattr("lightning_grpo.validation._vllm_installed", lambda: True)
    fit_error(ValueError, r"RolloutCallback.lora_sync='adapter' needs RolloutCallback.vllm_args.enable_lora: true",
              module=GRPOModule(lora=LoraSettings(r=4)), callback=hf_callback(engine="vllm", lora_sync="adapter"))  # fmt: skip


def test_lora_sync_adapter_with_hf_engine():
    fit_error(ValueError, r"RolloutCallback.lora_sync='adapter' hands the LoRA adapter to vLLM, but RolloutCallback.engine is 'hf'",
              module=GRPOModule(lora=LoraSettings(r=4)), callback=hf_callback(lora_sync="adapter"))  # fmt: skip


def test_lora_sync_adapter_without_lora(monkeypatch):
    monkeypatch.setattr("lightning_grpo.validation._vllm_installed", lambda: True)
    callback = hf_callback(engine="vllm", lora_sync="adapter", vllm_args={"enable_lora": True})
    fit_error(ValueError, r"RolloutCallback.lora_sync='adapter' needs a LoRA policy, but model.lora is not set", callback=callback)


def test_reference_adapter_without_lora():
    with pytest.raises(ValueError, match=r"reference='adapter' needs lora settings"):
        GRPOModule(reference="adapter")


def test_kl_beta_with_reference_none():
    fit_error(ValueError, r"model.loss.init_args.beta=0.04 puts a KL to the reference model in the loss, but model.reference='none'",
              module=GRPOModule(loss=GRPOLoss(beta=0.04), reference="none"))  # fmt: skip


def test_kl_in_reward_with_reference_none():
    fit_error(ValueError, r"model.kl_in_reward_coef=0.1 subtracts a KL to the reference model from the rewards, but model.reference='none'",
              module=GRPOModule(kl_in_reward_coef=0.1, reference="none"))  # fmt: skip


def test_temperature_zero_for_training():
    with pytest.raises(ValueError, match=r"RolloutCallback sampling.temperature must be > 0 for training \(0 is greedy decoding\)"):
        hf_callback(sampling=SamplingConfig(temperature=0.0))


def test_forward_rows_zero():
    fit_error(ValueError, r"RolloutCallback.forward_rows must be an integer >= 1, got 0", callback=hf_callback(forward_rows=0))


@pytest.mark.parametrize(
    ("lr", "message"),
    [
        (-1e-3, r"model.optimizer: AdamW rejected its arguments: Invalid learning rate: -0.001"),
        (0.0, r"model.optimizer: the learning rate must be > 0 \(0 never changes the policy\), got 0.0"),
    ],
    ids=["negative", "zero"],
)
def test_learning_rate_not_positive(lr, message):
    fit_error(ValueError, message, module=GRPOModule(optimizer=functools.partial(torch.optim.AdamW, lr=lr)))


def test_num_iterations_zero():
    with pytest.raises(ValueError, match=r"num_iterations and steps_per_generation must be >= 1, got 0, 1"):
        GRPOModule(num_iterations=0)


# ================================================================================ 8. model
def test_model_directory_without_config(tmp_path):
    fit_error(FileNotFoundError, rf"model.model: {tmp_path} has no config.json \(expected a Hugging Face model directory",
              module=GRPOModule(model=str(tmp_path)))  # fmt: skip


def test_model_path_missing(tmp_path):
    fit_error(FileNotFoundError, rf"model.model: {tmp_path}/nowhere is not a directory", module=GRPOModule(model=str(tmp_path / "nowhere")))
