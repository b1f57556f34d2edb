"""Pre-flight: a server the run depends on that refuses connections, or a
teacher folder that is missing, is one line from ``lightning-grpo fit`` (the URL or the path, and
what to do), within seconds and before any engine is built (:mod:`lightning_grpo.checks.preflight`)."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path
from unittest import mock

import pytest

from lightning_grpo.checks.preflight import making_command, unreachable
from tests.helpers.bad_input import write_config
from tests.helpers.runs import ROOT

pytestmark = pytest.mark.usefixtures("tiny_cache")


def refusing_url(scheme: str = "http") -> str:
    """A loopback URL nothing listens on: a port bound (so free), then closed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"{scheme}://127.0.0.1:{port}"


def fit_lines(tmp_path: Path, capsys, **overrides) -> list[str]:
    """``lightning-grpo fit`` on a small recipe: it exits with status 2 within 20 s, no engine built;
    the lines it printed (stdout and stderr)."""
    from lightning_grpo.cli import main

    path = write_config(tmp_path, **overrides)
    start = time.perf_counter()
    with (
        mock.patch.object(sys, "argv", ["lightning-grpo"]),
        mock.patch("lightning_grpo.callbacks.rollout.RolloutCallback.ensure_engine") as build,
        pytest.raises(SystemExit) as exit_,
    ):
        main(["fit", "-c", str(path)])
    assert exit_.value.code == 2 and not build.called
    assert time.perf_counter() - start < 20
    captured = capsys.readouterr()
    assert not (tmp_path / "logs").exists()
    return [line for line in (captured.out + captured.err).splitlines() if line.strip()]


def test_vllm_server_url_refusing_connections(tmp_path, capsys):
    url = refusing_url()
    lines = fit_lines(
        tmp_path,
        capsys,
        **{"rollout.engine": {"class_path": "lightning_grpo.ServerSettings", "init_args": {"urls": [url]}}},
    )
    assert lines[-1] == (
        f"lightning-grpo: error: rollout.engine.init_args.urls: {url} refused the connection (nothing listens there): "
        "start the vLLM server first (docs/guide/scaling.md), or drop rollout.engine.init_args.urls to have the run "
        "start its own"
    )
    assert len(lines) <= 3, lines


def test_openenv_url_refusing_connections(tmp_path, capsys):
    pytest.importorskip("openenv.core")
    url = refusing_url()
    rollout = {
        "class_path": "lightning_grpo.AgentRolloutCallback",
        "init_args": {
            "engine": "hf",
            "sampling": {"n": 4, "max_new_tokens": 3},
            "agent": {
                "environment": "lightning_grpo.integrations.openenv.OpenEnvClientEnvironment",
                "environment_args": {"base_url": url, "action_field": "message"},
            },
        },
    }
    lines = fit_lines(tmp_path, capsys, rollout=rollout)
    assert lines[-1] == (
        f"lightning-grpo: error: rollout.agent.environment_args.base_url: {url} refused the connection (nothing listens there): "
        "start the environment's server first (docs/guide/environments.md) and check the port"
    )
    assert len(lines) <= 3, lines


def test_judge_url_refusing_connections(tmp_path, capsys):
    url = refusing_url()
    rewards = [{"name": "prefix_match"}, {"name": "llm_judge", "kwargs": {"base_url": f"{url}/v1", "model": "judge"}}]
    lines = fit_lines(tmp_path, capsys, **{"rollout.rewards": rewards})
    assert lines[-1] == (
        f"lightning-grpo: error: rollout.rewards[1] (llm_judge): {url}/v1/chat/completions refused the connection "
        "(nothing listens there): start the reward's server first (docs/guide/reward-models.md) and check its base_url"
    )
    assert len(lines) <= 3, lines


def test_missing_teacher_folder_names_the_command_of_the_recipe_header(tmp_path, capsys):
    teacher = tmp_path / "teacher"
    command = (
        f"lightning-grpo fit -c recipes/quickstart.yaml --seed_everything 2 --trainer.callbacks+=lightning_grpo.SavePretrained "
        f"--trainer.callbacks.dirpath={teacher}"
    )
    lines = fit_lines(tmp_path, capsys, **{"model.distillation": {"teacher": str(teacher)}})
    assert lines[-1].startswith(
        f"lightning-grpo: error: model.distillation.teacher: {teacher} does not exist (expected a model folder); "
        "make it first, e.g. train a teacher with --trainer.callbacks+=lightning_grpo.SavePretrained"
    ), lines
    path = write_config(tmp_path, **{"model.distillation": {"teacher": str(teacher)}})
    continued = command.replace(" --trainer.callbacks+", " \\\n#     --trainer.callbacks+")  # a "\"-continued line
    header = f"# the teacher, saved by SavePretrained:\n#   {continued}\n"
    path.write_text(header + path.read_text())
    from lightning_grpo.cli import main

    with mock.patch.object(sys, "argv", ["lightning-grpo"]), pytest.raises(SystemExit):
        main(["fit", "-c", str(path)])
    last = capsys.readouterr().err.splitlines()[-1]
    assert (
        last
        == f"lightning-grpo: error: model.distillation.teacher: {teacher} does not exist (expected a model folder); make it first: {command}"
    )


def test_the_distill_recipes_headers_name_the_teacher_command():
    expected = (
        "lightning-grpo fit -c recipes/quickstart.yaml --seed_everything 2 --trainer.callbacks+=lightning_grpo.SavePretrained "
        "--trainer.callbacks.dirpath=runs/distill_teacher"
    )
    for recipe in ("distill_quickstart.yaml", "gkd_quickstart.yaml"):
        assert making_command("runs/distill_teacher", [ROOT / "recipes" / recipe]) == expected
    assert making_command("runs/other_teacher", [ROOT / "recipes" / "distill_quickstart.yaml"]) is None


def test_a_listening_server_passes_and_a_refusing_one_fails_at_once():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert unreachable(f"http://127.0.0.1:{server.getsockname()[1]}/v1") is None
    start = time.perf_counter()
    assert unreachable(refusing_url("ws")) == "refused the connection (nothing listens there)"
    assert unreachable("http://127.0.0.1:port") == "has a port that is not a number"
    assert time.perf_counter() - start < 2
