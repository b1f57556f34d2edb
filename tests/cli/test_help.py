"""The help: the top-level ``--help`` lists every command of the package (``predict`` is gone), and
``sft --help`` prints its own usage line and no warning."""

from __future__ import annotations

import re
import sys
import warnings
from unittest import mock

import pytest

from lightning_grpo.cli import main

COMMANDS = ("fit", "validate", "test", "sft", "export", "serve", "report", "fetch")


def _help(argv: list[str], capsys) -> str:
    """What ``lightning-grpo ARGV`` prints (sys.argv as the console script sets it); exit status 0."""
    with mock.patch.object(sys, "argv", ["lightning-grpo", *argv]), pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    captured = capsys.readouterr()
    return captured.out + captured.err


def test_top_level_help_lists_every_command_and_no_predict(capsys):
    text = _help(["--help"], capsys)
    usage = " ".join(text.split("\n\n")[0].split())
    assert usage.startswith("usage: lightning-grpo "), usage
    assert "{fit,validate,test,sft,export,serve,report,fetch}" in usage, usage
    listed = re.findall(r"^    (\w+) ", text, flags=re.MULTILINE)
    assert tuple(listed) == COMMANDS, listed
    assert "predict" not in text


def test_predict_is_refused_in_one_line(capsys):
    with mock.patch.object(sys, "argv", ["lightning-grpo", "predict"]), pytest.raises(SystemExit) as exit_:
        main(["predict"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    assert "invalid choice: 'predict'" in err.splitlines()[-1] and "'serve'" in err.splitlines()[-1], err


def test_sft_help_has_its_usage_line_and_no_warning(capsys):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        text = _help(["sft", "--help"], capsys)
    assert not [w for w in caught if "LightningCLI" in str(w.message)], [str(w.message) for w in caught]
    assert "LightningCLI's args parameter" not in text
    first = " ".join(text.split("\n\n")[0].split())
    assert first.startswith("usage: lightning-grpo sft "), first
    assert "{fit,validate,test}" in first and "predict" not in text and "serve" not in first


def test_fit_help_puts_our_groups_first_with_a_short_usage_and_the_common_optimizers(capsys):
    """``fit --help``: model, data and rollout options before the Trainer's; a one-line usage; the optimizer's and
    the scheduler's help name common classes, not every subclass jsonargparse finds."""
    text = _help(["fit", "--help"], capsys)
    lines = text.splitlines()
    assert lines[0].startswith("usage: lightning-grpo") and "--trainer.* ..." in lines[0] and not lines[1].strip()
    where = [text.index(f"\n  {option} ") for option in ("--model.model", "--data.batch_size", "--rollout.sampling.n")]
    assert where == sorted(where) and where[-1] < text.index("\n  --trainer.max_steps ")
    assert "torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD, or any class path" in " ".join(text.split())
    assert "Adadelta" not in text and "MultiplicativeLR" not in text
