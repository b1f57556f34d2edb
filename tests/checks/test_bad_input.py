"""Bad input, part 1 (variant names, YAML, data, rewards): every case fails with ONE clear error
that names the field or file and what was expected, before training starts, with nothing written
(no run directory, no checkpoint). Part 2: tests/checks/test_bad_input_fit.py.

Fit-level cases run ``trainer.fit`` on the built-in tiny model and digit task with the HF engine
and check that the error came before the policy was loaded, an engine was built or a training
step ran (:func:`tests.helpers.bad_input.fit_error`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from lightning_grpo import (
    AlgorithmSettings,
    GRPOLoss,
    GRPOModule,
    KLSettings,
    OffPolicySettings,
    PromptDataModule,
    RewardSpec,
    SelectionSettings,
)
from lightning_grpo.core import REWARD_AGGREGATIONS
from lightning_grpo.data.records import PromptFormat
from lightning_grpo.data.reward_set import RewardError, RewardSet
from lightning_grpo.data.sources import Rows
from lightning_grpo.data.tasks import DigitTask
from tests.helpers.bad_input import ROWS, cli, fit_error, hf_callback, write_config

pytestmark = pytest.mark.usefixtures("tiny_cache")


# =============================================================== 1. unknown variant names
@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: GRPOLoss(policy_loss="ppoo"), r"unknown policy loss 'ppoo'; valid names: .*\bcispo\b.*\bppo\b"),
        (
            lambda: GRPOLoss(aggregation="token_meen"),
            r"unknown loss aggregation 'token_meen'; valid names: .*\btoken_mean\b",
        ),
        (lambda: GRPOLoss(kl=KLSettings(estimator="k4")), r"unknown KL estimator 'k4'; valid names: .*\bk1\b.*\bk3\b"),
        (
            lambda: GRPOLoss(off_policy=OffPolicySettings(correction="tis")),
            r"unknown rollout correction 'tis'; valid names: .*\btis_token\b",
        ),
        (
            lambda: GRPOModule(model="tiny:chars", algorithm=AlgorithmSettings(advantage="grpoo")),
            r"unknown advantage estimator 'grpoo'; valid names: .*\bdr_grpo\b.*\bgrpo\b",
        ),
        (
            lambda: GRPOModule(model="tiny:chars", algorithm=AlgorithmSettings(reward_aggregation="sum")),
            r"unknown multi-reward aggregation 'sum'; valid names: .*\bsum_then_normalize\b",
        ),
        (
            lambda: SelectionSettings(gfpo_keep=2, gfpo_metric="shortest"),
            r"rollout.selection.gfpo_metric 'shortest' is not one of \['gfpo_length', 'gfpo_reward_per_token'\]",
        ),
        (
            lambda: RewardSet([RewardSpec("exact")]),
            r"unknown reward function 'exact'; registered: env_reward, exact_match, .*or give an import path",
        ),
    ],
    ids=[
        "policy_loss",
        "aggregation",
        "kl.estimator",
        "off_policy.correction",
        "advantage",
        "reward_aggregation",
        "gfpo_metric",
        "reward",
    ],
)
def test_unknown_variant_name_lists_the_valid_ones(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_unknown_engine_name_fails_when_the_callback_is_built():
    with pytest.raises(
        ValueError,
        match=r"^rollout.engine: unknown rollout engine 'vlm'; expected one of hf, (.*, )?vllm, vllm_server or",
    ):
        hf_callback(engine="vlm")
    with pytest.raises(ValueError, match=r"^rollout.engine: unknown rollout engine int; expected one of hf, "):
        hf_callback(engine=3)


# ================================================================ 2. YAML (LightningCLI)
@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("model.algorithm.num_iterations", "abc", "model.algorithm.num_iterations: expected an int, got abc"),
        ("data.batch_size", "two", "data.batch_size: expected an int, got two"),
        (
            "model.policy.dtype",
            "fp32",
            "model.policy.dtype: expected a Literal['float32', 'bfloat16', 'float16'], got fp32",
        ),
        (
            "model.algorithm.advantag",
            "grpo",
            "model.algorithm.advantag: not an option of 'model.algorithm' (did you mean 'advantage'?)",
        ),
        ("rollout.sampling", {"m": 4}, "rollout.sampling.m: not an option of lightning_grpo.SamplingConfig"),
        (
            "model.loss",
            {"class_path": "lightning_grpo.GRPOLoss", "init_args": {"policy_los": "ppo"}},
            "model.loss.policy_los: not an option of lightning_grpo.GRPOLoss (did you mean 'policy_loss'?)",
        ),
    ],
    ids=[
        "num_iterations_abc",
        "batch_size_two",
        "dtype_literal",
        "unknown_key",
        "unknown_nested_key",
        "unknown_loss_key",
    ],
)
def test_yaml_error_is_one_line_naming_the_field(tmp_path, capsys, key, value, message):
    """A parse error prints only ``lightning-grpo: error: <key>: <what is wrong>`` (no usage, no value dump)."""
    path = write_config(tmp_path, **{key: value})
    with pytest.raises(SystemExit) as exit_info:
        cli(["fit", "-c", str(path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"lightning-grpo: error: {message}"], err[-600:]
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"rollout.sampling": {"n": 1, "max_new_tokens": 3}},
            r"rollout.sampling.n=1 leaves 1 completion per prompt, but model.algorithm.advantage='grpo'",
        ),
        (
            {"model.optimizer": {"class_path": "torch.optim.AdamW", "init_args": {"lr": -0.01}}},
            r"model.optimizer: AdamW rejected its arguments: Invalid learning rate: -0.01",
        ),
        (
            {"data.source": {"class_path": "lightning_grpo.Rows", "init_args": {"train": [{"question": "12="}]}}},
            r"data.format.prompt_column 'prompt' not found in data.source.train; columns present: \['question'\]",
        ),
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
    dm = PromptDataModule(train_files=str(path), tokenizer_path="tiny:chars", batch_size=1)
    with pytest.raises(
        ValueError,
        match=rf"data.format.prompt_column 'prompt' not found in data.train_files {path}; columns present: \['q', 'a'\]",
    ):
        dm.setup("fit")


def test_empty_dataset():
    with pytest.raises(ValueError, match=r"^data.source.train holds no rows$"):
        PromptDataModule(source=Rows([]), tokenizer_path="tiny:chars", batch_size=1).setup("fit")


def test_empty_file(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match=r"data.train_files: .*empty.jsonl is empty \(holds no rows\)"):
        PromptDataModule(train_files=str(tmp_path / "empty.jsonl"))


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=rf"data.train_files: file not found: {tmp_path}/missing.jsonl"):
        PromptDataModule(train_files=str(tmp_path / "missing.jsonl"))


def test_fewer_prompts_than_batch_size_at_fit():
    fit_error(
        ValueError,
        r"data.source.train holds 2 prompts, fewer than data.batch_size=4",
        dm=PromptDataModule(source=Rows(ROWS), batch_size=4),
    )


def test_batch_size_zero():
    with pytest.raises(ValueError, match=r"data.batch_size must be a positive integer, got 0"):
        PromptDataModule(DigitTask(), batch_size=0)


def test_prompt_longer_than_max_errors():
    dm = PromptDataModule(
        source=Rows(ROWS), tokenizer_path="tiny:chars", batch_size=1, format=PromptFormat(max_prompt_length=4)
    )
    with pytest.raises(
        ValueError,
        match=r"prompt 1 of data.source.train has 5 tokens, more than data.format.max_prompt_length=4 \(set data.format.on_long_prompt: truncate",
    ):
        dm.setup("fit")


def test_prompt_longer_than_max_truncates_with_a_warning():
    dm = PromptDataModule(
        source=Rows(ROWS),
        tokenizer_path="tiny:chars",
        batch_size=1,
        format=PromptFormat(max_prompt_length=4, on_long_prompt="truncate"),
    )
    with pytest.warns(
        UserWarning,
        match=r"truncated 1 of 2 prompts of data.source.train to their last 4 tokens \(data.format.max_prompt_length\)",
    ):
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
    dm = PromptDataModule(
        source=Rows(ROWS), tokenizer_path=str(plain), format=PromptFormat(use_chat_template=True), batch_size=1
    )
    with pytest.raises(
        ValueError,
        match=rf"the tokenizer at {plain} has no chat template: set data.format.use_chat_template: false .* data.tokenizer_path",
    ):
        dm.setup("fit")


def test_tokenizer_without_eos(tiny_model_path, tmp_path):
    no_eos = _tokenizer_copy(tiny_model_path, tmp_path, lambda c: c.update(eos_token=None))
    dm = PromptDataModule(source=Rows(ROWS), tokenizer_path=str(no_eos), batch_size=1)
    with pytest.raises(
        ValueError,
        match=rf"the tokenizer at {no_eos} \(data.tokenizer_path\) has no EOS token, so no completion could end",
    ):
        dm.setup("fit")


def test_tokenizer_vocabulary_larger_than_the_policy(tiny_model_path, tmp_path):
    small = tmp_path / "small-vocab"
    small.mkdir()
    config = json.loads((Path(tiny_model_path) / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**config, "vocab_size": 8}))
    fit_error(
        ValueError,
        r"data.tokenizer_path \(.*\) does not belong to the policy \(.*small-vocab\): it has \d+ tokens, the policy's "
        r"embedding 8 rows; leave data.tokenizer_path unset",
        module=GRPOModule(model=str(small)),
        dm=PromptDataModule(DigitTask(), tokenizer_path=str(tiny_model_path), batch_size=4),
    )


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
        (
            raises_on_bad,
            r"reward function 'raises_on_bad' raised ZeroDivisionError: float division by zero on sample 1 \(completion 'bad'\)",
        ),
        (too_few, r"reward function 'too_few' returned the wrong number of scores: expected 2, got 1"),
        (words, r"reward function 'words' returned a non-number 'yes' \(str\) at index 0 \(completion 'ok'\)"),
        (
            nan_reward,
            r"reward function 'nan_reward' returned nan at index 0 \(completion 'ok'\); scores must be finite",
        ),
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
    with pytest.raises(
        ValueError,
        match=r"reward 'regex_format': unknown kwargs \['patern'\]; its named parameters are \['match', 'pattern'\]",
    ):
        RewardSet([RewardSpec("regex_format", kwargs={"patern": r"\d"})])


def test_reward_weights_length_mismatch():
    with pytest.raises(ValueError, match=r"weights must have shape \[R\]=\(2,\), got \(3,\)"):
        REWARD_AGGREGATIONS.get("sum_then_normalize")(torch.zeros(4, 2), [1.0, 1.0, 1.0], 2)
