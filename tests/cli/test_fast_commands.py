"""The commands that need no model answer without importing torch or Lightning: the top-level ``--help``, each of
``report``, ``export``, ``serve`` and ``fetch`` with ``--help``, and ``report`` on a run folder (what
benchmarks/bench_cli_start.py times)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.cli.test_help import COMMANDS

PROBE = """
import sys
from lightning_grpo.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exit_:
    assert exit_.code in (0, None), exit_.code
print("IMPORTED", "torch" in sys.modules, "lightning" in sys.modules)
"""


def _imports(args: list[str], cwd) -> str:
    done = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "args", [["--help"], ["report", "--help"], ["export", "--help"], ["serve", "--help"], ["fetch", "--help"]]
)
def test_help_of_the_light_commands_imports_neither_torch_nor_lightning(args, tmp_path):
    assert _imports(args, tmp_path) == "IMPORTED False False"


def test_report_of_a_run_imports_neither_torch_nor_lightning(tmp_path):
    run = tmp_path / "runs" / "mine" / "version_0"
    run.mkdir(parents=True)
    rows = "\n".join(f"{s},{0.1 + s / 20:.3f},{1.5 - s / 20:.3f}" for s in range(10))
    (run / "metrics.csv").write_text("step,train/reward_mean,train/entropy\n" + rows + "\n")
    assert _imports(["report", "runs/mine"], tmp_path) == "IMPORTED False False"
    assert (run / "report.txt").is_file()


def test_the_top_level_help_names_every_command_in_order(capsys):
    from lightning_grpo.cli.commands import OTHER_COMMANDS, SUBCOMMAND_HELP, top_level_help

    assert (*SUBCOMMAND_HELP, *OTHER_COMMANDS) == COMMANDS
    text = top_level_help()
    for name, line in {**SUBCOMMAND_HELP, **OTHER_COMMANDS}.items():
        assert " ".join(line.split()[:4]) in " ".join(text.split()), name
