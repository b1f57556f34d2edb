"""A recipe or command line with a key renamed when the settings were grouped gets one line naming the new key."""

import sys
from pathlib import Path
from unittest import mock

import pytest

from lightning_grpo.cli.renames import RENAMED, renamed_key_message

QUICKSTART = str(Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml")


@pytest.mark.parametrize(
    "recipe, args, line",
    [
        (
            "model:\n  model: tiny:chars\n  dtype: float32\n",
            [],
            "model.dtype was renamed in lightning-grpo 0.1.0: use model.policy.dtype",
        ),
        (
            "model:\n  model: tiny:chars\n  loss:\n    class_path: lightning_grpo.GRPOLoss\n    init_args: {beta: 0.04}\n",
            [],
            "model.loss.beta was renamed in lightning-grpo 0.1.0: use model.loss.init_args.kl.beta",
        ),
        (
            "model:\n  model: tiny:chars\ndata:\n  task_rule: last_digit\n",
            [],
            "data.task_rule was renamed in lightning-grpo 0.1.0: use data.source",
        ),
        (
            "rollout:\n  val_samples: 4\n",
            [],
            "rollout.val_samples was renamed in lightning-grpo 0.1.0: use rollout.evaluation.samples",
        ),
        (
            None,
            ["--model.num_iterations", "2"],
            "model.num_iterations was renamed in lightning-grpo 0.1.0: use model.algorithm.num_iterations",
        ),
        (
            None,
            ["--rollout.vllm_args.dtype", "float32"],
            "rollout.vllm_args was renamed in lightning-grpo 0.1.0: use rollout.vllm",
        ),
    ],
    ids=["model.dtype", "loss.beta", "data.task_rule", "rollout.val_samples", "command line", "under a renamed parent"],
)
def test_an_old_key_is_one_line_naming_the_new_one(tmp_path, capsys, recipe, args, line):
    from lightning_grpo.cli import main

    path = tmp_path / "old.yaml"
    path.write_text(recipe or "")
    config = ["-c", str(path)] if recipe else ["-c", QUICKSTART]
    with mock.patch.object(sys, "argv", ["lightning-grpo"]), pytest.raises(SystemExit) as exit_:
        main(["fit", *config, *args, "--print_config"])
    assert exit_.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"lightning-grpo: error: {line}"), last


def test_a_misspelt_new_key_is_not_taken_for_a_renamed_one():
    assert renamed_key_message("model.algorithm.num_iteratons") is None
    assert renamed_key_message("model.loss.init_args.kl.beta") is None  # the new key itself


def test_every_old_key_is_gone_from_the_recipes():
    """No recipe still writes a key of the table (a recipe that did would fail to load)."""
    import yaml

    def keys(node, prefix=""):
        if isinstance(node, dict):
            for k, v in node.items():
                yield f"{prefix}{k}"
                yield from keys(v, f"{prefix}{k}.")

    plain = {".".join(p for p in old.split(".") if p != "init_args") for old in RENAMED}
    for recipe in sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml")):
        found = {
            ".".join(p for p in k.split(".") if p != "init_args") for k in keys(yaml.safe_load(recipe.read_text()))
        }
        assert not found & plain, f"{recipe.name}: {sorted(found & plain)}"
