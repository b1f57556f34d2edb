"""Completion logs: ``completions.jsonl`` rows of a training run, the logger tables, the guards'
pointers to the completions of the step they fired at, and ``lightning-grpo report`` showing them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, MLFlowLogger, TensorBoardLogger, WandbLogger

from lightning_grpo.callbacks.completions import CompletionLogSettings, log_table
from lightning_grpo.cli import report
from tests.helpers.runs import train_recipe as _train

pytestmark = pytest.mark.usefixtures("tiny_cache")


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "completions.jsonl").read_text().splitlines()]


def test_logged_rows_hold_the_step_texts_rewards_and_advantages(tmp_path):
    """Quickstart, 4 steps, every 2nd step logged whole: each logged step's 64 rows decode to the sampled
    texts, their rewards are the task's (the completion, leading spaces removed, starts with (last digit + 1)
    mod 10), their mean equals the step's train/reward_mean, and each group's advantages are its normalised
    rewards."""
    # the whole dict: jsonargparse reads a nested ``--rollout.log_completions.groups=null`` as the string 'None'
    _, run_dir = _train(
        tmp_path, "quickstart.yaml", 4, extra=["--rollout.log_completions={every_n_steps: 2, groups: null}"]
    )
    rows = _rows(run_dir)
    assert sorted({r["step"] for r in rows}) == [0, 2] and len(rows) == 2 * 8 * 8
    reward_mean = dict(report.load_run(run_dir).series["train/reward_mean"])
    for step in (0, 2):
        at = [r for r in rows if r["step"] == step]
        assert sum(r["reward"] for r in at) / len(at) == pytest.approx(reward_mean[step], abs=1e-6)
        for r in at:
            answer = str((int(r["prompt"][-2]) + 1) % 10)  # "4821=" -> "2"
            assert (
                r["rewards"] == {"prefix_match": float(r["completion"].lstrip().startswith(answer))}
                and r["reward"] == r["rewards"]["prefix_match"]
            ), r
            # at most one character per token, special tokens decode to nothing; a completion that stopped
            # before max_new_tokens (2) ended with EOS, one that did not is cut at 2 tokens
            assert 1 <= r["length"] <= 2 and len(r["completion"]) <= r["length"] - (0 if r["truncated"] else 1)
            assert r["length"] == 2 or not r["truncated"]
        for g in range(8):
            group = [r for r in at if r["group"] == g]
            rewards = torch.tensor([r["reward"] for r in group])
            expected = (rewards - rewards.mean()) / (rewards.std() + 1e-6) if rewards.std() > 0 else torch.zeros(8)
            torch.testing.assert_close(torch.tensor([r["advantage"] for r in group]), expected, atol=1e-4, rtol=0)
    text, _ = report.write_report(run_dir, png=False)
    assert "completions of step 2 (the last logged; 64 rows in completions.jsonl), best and worst 3:" in text
    assert text.count("  best: reward ") == 3 and text.count("  worst: reward ") == 3


def test_a_firing_guard_logs_its_step_and_points_to_it(tmp_path):
    """EntropyGuard with an unreachable floor fires at every step; nothing is logged on schedule
    (every_n_steps 0), yet each alarm's step has its rows and its record points to them."""
    guard = {"class_path": "lightning_grpo.EntropyGuard", "init_args": {"floor": 100.0, "max_reward": 1.1}}
    _, run_dir = _train(
        tmp_path,
        "quickstart.yaml",
        2,
        extra=["--rollout.log_completions.every_n_steps=0", f"--trainer.callbacks+={json.dumps(guard)}"],
    )
    alarms = [json.loads(line) for line in (run_dir / "alarms.jsonl").read_text().splitlines()]
    fired = [a for a in alarms if a["guard"] == "entropy"]
    assert fired and all(a["completions"] == f"completions.jsonl step {a['step']}" for a in fired)
    assert {r["step"] for r in _rows(run_dir)} == {a["step"] for a in fired}
    assert len([r for r in _rows(run_dir) if r["step"] == fired[0]["step"]]) == 2 * 8  # the default 2 groups
    text, _ = report.write_report(run_dir, png=False)
    assert f"its completions: completions.jsonl step {fired[0]['step']}" in text


def test_agent_rows_carry_the_transcript(tmp_path, monkeypatch):
    """Each logged episode's transcript holds, framed by the template's tool-response markers, exactly
    what its tool calls returned (the episode's secret digit), once per call that ran."""
    from lightning_grpo.agents.callback import AgentRolloutCallback
    from lightning_grpo.agents.tools import tool_messages

    rollouts, run = [], AgentRolloutCallback.run

    def recording_run(self, engine, tokenizer, records, sampling, seed):
        rollouts.append(run(self, engine, tokenizer, records, sampling, seed))
        return rollouts[-1]

    monkeypatch.setattr(AgentRolloutCallback, "run", recording_run)
    _, run_dir = _train(
        tmp_path, "tool_quickstart.yaml", 1, extra=["--rollout.log_completions={every_n_steps: 1, groups: null}"]
    )
    rows = _rows(run_dir)
    assert len(rows) == 8 * 8 and all({"transcript", "turns"} <= set(r) for r in rows)
    (train,) = [r for r in rollouts if r.group_size == 8]  # the one training generation (validation samples n = 1)
    called = 0
    for row, episode in zip(rows, train.episodes, strict=True):  # the batch's episodes, in order
        returned = tool_messages(episode.messages)  # what the episode's tool calls returned
        assert re.findall(r"<tool_response>\n(.*?)\n</tool_response>", row["transcript"]) == returned
        assert all(content == episode.env.secret for content in returned)
        called += bool(returned)
    assert called >= 3, called  # the untrained policy calls the tool in some episodes


class _Wandb(WandbLogger):  # subclasses of Lightning's loggers (a user's own logger class gets the table too)
    def __init__(self, calls):
        self.calls = calls

    def log_table(self, **kw):
        self.calls.setdefault("wandb", kw)


class _Experiment:  # first in the bases: its experiment replaces the logger's
    def __init__(self, experiment):
        self._fake = experiment

    @property
    def experiment(self):
        return self._fake


class _TensorBoard(_Experiment, TensorBoardLogger):
    pass


class _MLFlow(_Experiment, MLFlowLogger):
    run_id = property(lambda self: "r1")


def test_logger_tables_by_logger_type():
    rows = [
        {
            "step": 3,
            "group": 0,
            "prompt": "12=",
            "completion": "3|x\n",
            "rewards": {"exact_match": 1.0},
            "reward": 1.0,
            "advantage": 0.5,
            "length": 2,
            "truncated": False,
        }
    ]
    calls = {}
    log_table(_Wandb(calls), rows, 3)
    assert calls["wandb"]["key"] == "completions" and calls["wandb"]["step"] == 3
    assert calls["wandb"]["data"][0][:4] == [3, 0, "12=", "3|x\n"] and calls["wandb"]["columns"][4] == "rewards"
    experiment = SimpleNamespace(
        add_text=lambda tag, text, global_step: calls.setdefault("tb", (tag, text, global_step)),
        log_table=lambda run_id, data, artifact_file: calls.setdefault("mlflow", (run_id, data, artifact_file)),
    )
    log_table(_TensorBoard(experiment), rows, 3)
    tag, text, step = calls["tb"]
    assert tag == "completions" and step == 3 and "| 3 | 0 | 12= | 3\\|x<br> |" in text
    log_table(_MLFlow(experiment), rows, 3)
    assert calls["mlflow"] == (
        "r1",
        {
            **{c: [v] for c, v in zip(["step", "group", "prompt", "completion"], [3, 0, "12=", "3|x\n"])},
            "rewards": ['{"exact_match": 1.0}'],
            "reward": [1.0],
            "advantage": [0.5],
            "length": [2],
            "truncated": [False],
        },
        "completions/step_0000003.json",
    )
    log_table(CSVLogger("unused"), rows, 3)  # the jsonl file is its table
    log_table(type("TensorBoardLogger", (), {"experiment": None})(), rows, 3)  # a look-alike by name: nothing
    assert len(calls) == 3


def test_settings_are_checked():
    with pytest.raises(ValueError, match=r"rollout.log_completions.every_n_steps must be an integer >= 0, got -1"):
        CompletionLogSettings(every_n_steps=-1)
    with pytest.raises(
        ValueError, match=r"rollout.log_completions.groups must be an integer >= 1 or null \(all\), got 0"
    ):
        CompletionLogSettings(groups=0)
