"""What a matrix cell asserts about its runs: the logged metrics (CSV or TensorBoard), the completions
log against the task's rule, a resumed run against the uninterrupted one, an export against the
trained policy."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path
from typing import Any

import torch

from .envs import AGAIN, answer_of, turn_reward
from .probe import PROBE_IDS

LOGPROB_GAP = 1e-4  # engine vs trainer log-probs of the sampled tokens, float32
EXPORT_GAP = 1e-5  # exported folder's logits vs the trained policy's
OPENING = re.compile(r"(\d{4}=)")


# ------------------------------------------------------------------------------------ metrics
def train_rows(run_dir: Path, logging: str) -> list[dict[str, float]]:
    """One dict per logged optimizer step (those with ``train/loss``), in step order."""
    rows = _csv_rows(run_dir) if logging == "csv" else _tensorboard_rows(run_dir)
    return sorted((r for r in rows if "train/loss" in r), key=lambda r: r["step"])


def _csv_rows(run_dir: Path) -> list[dict[str, float]]:
    out = []
    with open(run_dir / "metrics.csv") as f:
        for row in csv.DictReader(f):
            out.append({k: float(v) for k, v in row.items() if v not in ("", None)})
    return out


def _tensorboard_rows(run_dir: Path) -> list[dict[str, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    by_step: dict[int, dict[str, float]] = {}
    for tag in acc.Tags()["scalars"]:
        for event in acc.Scalars(tag):
            by_step.setdefault(event.step, {"step": float(event.step)})[tag] = event.value
    return list(by_step.values())


def check_logprob_agreement(rows: list[dict[str, float]]) -> list[float]:
    """``train/mismatch_max_abs`` (max |engine - trainer| log-prob over the step's sampled tokens) of
    every logged step is at most :data:`LOGPROB_GAP`; returns the gaps."""
    gaps = [r.get("train/mismatch_max_abs", math.nan) for r in rows]
    assert gaps and all(g <= LOGPROB_GAP for g in gaps), f"train/mismatch_max_abs per step {gaps} (limit {LOGPROB_GAP})"
    return gaps


# -------------------------------------------------------------------------------- completions
def completion_rows(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "completions.jsonl"
    assert path.is_file(), f"no completions log {path}"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check_completions(
    rows: list[dict[str, Any]], rollout: str, train_prompts: set[str], steps: int, per_step: int
) -> None:
    """Every logged prompt is a sampled one (a training prompt, or the episode's real opening) and
    the logged reward is that prompt's reward for that completion under the task's rule."""
    by_step: dict[int, int] = {}
    for row in rows:
        by_step[row["step"]] = by_step.get(row["step"], 0) + 1
        expected = _single_reward(row, train_prompts) if rollout == "single" else _episode_reward(row)
        assert row["reward"] == expected, (
            f"logged reward {row['reward']} != {expected} recomputed from the logged prompt: {row}"
        )
    assert sorted(by_step) == list(range(steps)), f"completions logged at steps {sorted(by_step)}"
    assert all(n == per_step for n in by_step.values()), (
        f"rows per step {by_step}, expected {per_step} (rank 0's batch)"
    )


def _single_reward(row: dict[str, Any], train_prompts: set[str]) -> float:
    prompt = row["prompt"]
    assert prompt in train_prompts, f"logged prompt {prompt!r} is not a training prompt"
    return float(row["completion"].lstrip().startswith(answer_of(prompt)))


def _episode_reward(row: dict[str, Any]) -> float:
    """The episode's reward from its logged prompt (its opening) and transcript (turns split at the
    assistant marker; the environment answers :data:`~tests.e2e.matrix.envs.AGAIN` between turns)."""
    openings = OPENING.findall(row["prompt"])
    assert len(openings) == 1, f"logged prompt {row['prompt']!r} does not hold one opening dddd="
    opening = openings[0]
    marker = "<|im_start|>assistant\n"
    turns = [t.split("<|im_end|>")[0] for t in (marker + row["transcript"]).split(marker)[1:]]
    assert 1 <= len(turns) <= 2 and row["turns"] == len(turns), f"turns of {row}"
    if len(turns) == 2:
        assert AGAIN in row["transcript"], f"a second turn without the environment's answer: {row}"
    return sum(turn_reward(opening, text, i) for i, text in enumerate(turns))


def train_prompts() -> set[str]:
    """The quickstart's training prompts (the built-in digit task, as the recipe's data section builds them)."""
    import yaml

    from lightning_grpo import DigitTask, PromptDataModule

    from .runner import RECIPE

    data = yaml.safe_load(RECIPE.read_text())["data"]
    source = data.pop("source")
    assert source["class_path"] == "lightning_grpo.DigitTask", source
    data.setdefault("tokenizer_path", yaml.safe_load(RECIPE.read_text())["model"]["model"])  # the policy's (tiny:chars)
    dm = PromptDataModule(DigitTask(**source.get("init_args", {})), **data)
    dm.setup("fit")
    return {r["prompt"] for r in dm.train_records}


# -------------------------------------------------------------------------- resume and export
def check_resume(a_ckpt: Path, b_ckpt: Path, a_rows: list[dict], b_rows: list[dict]) -> None:
    """The resumed run's last checkpoint and last logged step equal the uninterrupted run's."""
    from lightning_grpo.models.export import load_checkpoint

    a_state, _, _ = load_checkpoint(a_ckpt)
    b_state, _, _ = load_checkpoint(b_ckpt)
    assert set(a_state) == set(b_state)
    for name, value in a_state.items():
        torch.testing.assert_close(
            b_state[name], value, atol=1e-6, rtol=0, msg=lambda m, name=name: f"resumed {name}: {m}"
        )
    last_a, last_b = a_rows[-1], b_rows[-1]
    assert last_a["step"] == last_b["step"], f"last logged step {last_a['step']} (a) vs {last_b['step']} (b)"
    for key in ("train/loss", "train/reward_mean", "train/grad_norm", "train/mismatch_max_abs"):
        if key in last_a:
            assert last_b.get(key) == _approx(last_a[key]), (
                f"{key}: resumed {last_b.get(key)} vs uninterrupted {last_a[key]}"
            )


def _approx(value: float):
    import pytest

    return pytest.approx(value, abs=1e-6, rel=1e-5)


def check_export(folder: Path, probe_file: Path) -> float:
    """The exported folder, loaded with transformers, gives the trained policy's logits; returns the gap."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(PROBE_IDS)).logits.float()  # [1, T, V]
    trained = torch.load(probe_file, weights_only=False)["logits"]
    gap = (logits - trained).abs().max().item()
    assert gap <= EXPORT_GAP, f"exported logits differ from the trained policy's by {gap} (limit {EXPORT_GAP})"
    return gap
