"""The README runs as written: its Python example trains (a few steps), and each ``lightning-grpo fit`` line
of it parses with the CLI from a folder holding the files it names (``my.jsonl``, ``my_rewards.py``). The
README's other commands run in ``.ci/run`` (install, quickstart, report, the test suite)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MY_REWARDS = """
def first_digit(completions, answer, **columns):
    return [1.0 if text[:1] == right else 0.0 for text, right in zip(completions, answer)]
"""


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", README.read_text(), flags=re.S)


def fit_commands() -> list[list[str]]:
    """The ``.venv/bin/lightning-grpo fit ...`` lines of the README's bash blocks, without the comment."""
    lines = [line for block in blocks("bash") for line in block.splitlines()]
    return [shlex.split(line, comments=True)[1:] for line in lines if line.startswith(".venv/bin/lightning-grpo fit")]


def test_the_readme_is_short_and_its_python_example_trains(tmp_path, monkeypatch, tiny_cache):
    monkeypatch.chdir(tmp_path)  # the Trainer's checkpoints go to the working folder
    assert len(README.read_text().splitlines()) <= 150, "the README is for users: at most 150 lines"
    (example,) = blocks("python")
    assert 15 <= len(example.strip().splitlines()) <= 25
    short, count = re.subn(r"max_steps=\d+", "max_steps=2", example)
    assert count == 1, "the README example's Trainer sets max_steps"
    namespace = {"__name__": "readme_example"}
    exec(compile(short, "README.md", "exec"), namespace)
    assert namespace["trainer"].global_step == 2
    assert 0.0 <= namespace["before"] <= 1.0 and 0.0 <= namespace["after"] <= 1.0  # what it prints, before -> after
    assert re.search(r"prints `held-out greedy accuracy: 0\.\d\d -> 0\.\d\d`", README.read_text())


#: Lines a healthy run must not print (Lightning's adverts and warnings about our objects, our pass / fail note).
NOISE = ("Tip:", "LeafSpec", "IterableDataset", "Total length of", "FLOPs", "pass / fail", "weights_only", "Warning")


def test_the_readme_example_prints_few_lines_and_no_noise(tmp_path, tiny_cache):
    """The example as a user runs it (its own process, the console as it is), 3 steps: what it prints is the
    Trainer's start lines, the policy line, the bars and the before -> after line; none of :data:`NOISE`."""
    (example,) = blocks("python")
    script = tmp_path / "example.py"
    script.write_text(re.sub(r"max_steps=\d+", "max_steps=3", example))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # tiny_cache: LIGHTNING_GRPO_CACHE, the session's tiny model
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.stdout.strip().splitlines()[-1].startswith("held-out greedy accuracy: ")
    noise = [line for line in lines if any(word in line for word in NOISE)]
    assert not noise, noise
    assert len(lines) <= 12, lines  # seed, GPU, TPU, weights bar, policy line, 3 bars, fit stopped, the result


def test_the_readme_install_lines_are_what_ci_runs():
    """Until the release the README says the package is not on PyPI and installs from the clone: its first command
    (``scripts/install.sh``, run by .ci/run) or the wheel lines of ## Install, which scripts/check_wheel.sh (a step
    of .ci/run) reads from the README and runs as written in a fresh venv."""
    text = README.read_text()
    install = text[text.index("## Install\n") :]
    assert "not on PyPI yet" in install and "pip install 'lightning-grpo[cpu]'" in install
    assert "PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu" in install
    assert blocks("bash")[0].startswith("bash scripts/install.sh &&")
    assert "\nbash scripts/install.sh\n" in (ROOT / ".ci/run").read_text()
    wheel_lines = re.search(r"```bash\n(.*?)```", install, re.S).group(1)
    assert "python -m build --wheel --outdir dist ." in wheel_lines and "dist/lightning_grpo-*.whl)[cpu]" in wheel_lines
    check_wheel = (ROOT / "scripts/check_wheel.sh").read_text()
    assert 'text.index("## Install' in check_wheel and 'bash -euo pipefail "$work/readme_install.sh"' in check_wheel


@pytest.mark.parametrize("args", fit_commands(), ids=lambda a: " ".join(a)[:60])
def test_each_readme_fit_command_parses(args, tmp_path, monkeypatch, capsys, tiny_cache):
    from lightning_grpo.cli import main
    from lightning_grpo.data.reward_set import RewardSet

    (tmp_path / "recipes").symlink_to(ROOT / "recipes")
    (tmp_path / "my.jsonl").write_text('{"prompt": "4821=", "answer": "2"}\n')
    (tmp_path / "my_rewards.py").write_text(MY_REWARDS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)  # another test's my_rewards.py, imported first
    extra = [] if "--print_config" in args else ["--print_config"]
    with mock.patch.object(sys, "argv", ["lightning-grpo"]), pytest.raises(SystemExit) as exit_:
        main([*args, *extra])
    assert exit_.value.code == 0, capsys.readouterr().err[-2000:]
    config = yaml.safe_load(capsys.readouterr().out)
    rewards = RewardSet(config["rollout"]["init_args"]["rewards"] or [{"name": "exact_match"}])  # names resolve
    if "--rollout.rewards" in args:
        assert [fn.__name__ for fn in rewards.fns] == ["first_digit"]
    if "--data.train_files" in args:
        data = config["data"].get("init_args", config["data"])
        assert data["train_files"] == "my.jsonl" and data["source"] is None


def test_the_readme_shows_a_recipe_an_override_a_data_file_and_a_reward():
    joined = [" ".join(args) for args in fit_commands()]
    assert any(a.startswith("fit -c recipes/") and a.count("--") == 0 for a in joined)
    assert any("--trainer.max_steps" in a for a in joined)
    assert any("--data.train_files" in a for a in joined)
    assert any("--rollout.rewards" in a for a in joined)


def test_the_readme_links_point_at_files_there_are():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    local = [link for link in links if not link.startswith(("http://", "https://"))]
    assert local, "the README links into the docs"
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, f"README links to missing files: {missing}"
