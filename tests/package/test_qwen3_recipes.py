"""The two-stage Qwen3 recipes (recipes/qwen3_<track>_sft.yaml, then recipes/qwen3_<track>_grpo.yaml; the tool and the
text track) on the real Qwen3 tokenizer: stage 1 writes a run folder, stage 2 starts from it as written (model.model: runs/qwen3_tool_sft)
and trains: the call and the tool's answer in real BPE tokens, through the HF engine (the session's vLLM engine
serves the tiny character model)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from tests.helpers.bad_input import HF_ENGINE

ROOT = Path(__file__).resolve().parents[2]
TRACKS = ["tool", "text"]


def _stages(track: str) -> tuple[Path, Path]:
    return ROOT / f"recipes/qwen3_{track}_sft.yaml", ROOT / f"recipes/qwen3_{track}_grpo.yaml"


@pytest.mark.parametrize("track", TRACKS)
def test_the_stages_name_each_other_and_pose_the_same_task(track):
    paths = _stages(track)
    sft, grpo = (yaml.safe_load(p.read_text()) for p in paths)
    assert grpo["model"]["model"] == f"runs/{sft['trainer']['logger']['init_args']['name']}"
    assert sft["data"]["tokenizer_path"] == grpo["data"]["tokenizer_path"] == "tiny:qwen3"
    assert (
        sft["model"]["model"] == {"tool": "tiny:qwen3-untied-8h", "text": "tiny:qwen3"}[track]
    )  # docs/evidence/qwen3.md says why
    assert f"lightning-grpo sft fit -c recipes/qwen3_{track}_sft.yaml" in paths[1].read_text()
    task = dict(sft["data"]["source"]["init_args"])
    if track == "tool":
        assert task["question"] == grpo["rollout"]["init_args"]["agent"]["environment_args"]["question"]
    else:  # the same rows; only SFT's demonstrator is weak, and GRPO is rewarded on the right answer
        assert sft["data"]["source"]["class_path"] == grpo["data"]["source"]["class_path"]
        assert {k: v for k, v in task.items() if k not in ("weak_digits", "slip")} == grpo["data"]["source"][
            "init_args"
        ]
        assert (
            sft["data"]["format"]["answer_column"] == "demonstration" and "answer_column" not in grpo["data"]["format"]
        )
        assert (
            sft["data"]["format"]["chat_template_kwargs"]
            == grpo["data"]["format"]["chat_template_kwargs"]
            == {"enable_thinking": False}
        )

    for stage in (sft, grpo):  # a schedule that spans a number of steps spans the stage's steps
        schedule = (stage["model"].get("lr_scheduler") or {}).get("init_args", {})
        assert schedule.get("T_max", stage["trainer"]["max_steps"]) == stage["trainer"]["max_steps"]
        assert schedule.get("total_iters", 0) < stage["trainer"]["max_steps"]  # a warm-up ends within the run


#: per track: SFT options for a small run, GRPO options for the HF engine and a small step
SMALL = {
    "tool": (
        ["--data.source.init_args.num_train", "16", "--data.source.init_args.num_val", "4"],
        [*HF_ENGINE, "--rollout.init_args.sampling.n", "4"],
    ),
    "text": (
        [
            "--data.source.init_args.num_train",
            "16",
            "--data.source.init_args.num_val",
            "4",
            "--data.source.init_args.num_test",
            "4",
        ],
        [
            *HF_ENGINE,
            "--rollout.sampling.n",
            "4",
            "--data.source.init_args.num_train",
            "16",
            "--data.source.init_args.num_val",
            "4",
            "--data.source.init_args.num_test",
            "4",
        ],
    ),
}


@pytest.mark.parametrize("track", TRACKS)
def test_sft_then_grpo_from_its_run_folder(track, tmp_path, monkeypatch, qwen_tokenizer):
    from lightning_grpo.cli import main

    sft, grpo = _stages(track)
    monkeypatch.chdir(tmp_path)  # stage 2 reads runs/qwen3_<track>_sft as written, relative to the working directory
    monkeypatch.setenv("LIGHTNING_GRPO_CACHE", str(tmp_path / "cache"))
    quiet = ["--trainer.enable_progress_bar", "false", "--trainer.max_steps", "2"]
    main(["sft", "fit", "-c", str(sft), *quiet, *SMALL[track][0], "--data.batch_size", "4"])
    assert (tmp_path / f"runs/qwen3_{track}_sft/version_0/checkpoints/last.ckpt").is_file()
    main(
        ["fit", "-c", str(grpo), *quiet, *SMALL[track][1], "--data.batch_size", "1", "--trainer.log_every_n_steps", "1"]
    )
    exported = tmp_path / f"runs/qwen3_{track}_sft/version_0/checkpoints/last_model/config.json"  # exported once
    assert json.loads(exported.read_text())["tie_word_embeddings"] == (track == "text")  # the tool track's own LM head
    with open(tmp_path / f"runs/qwen3_{track}_grpo/version_0/metrics.csv") as handle:
        rows = [r for r in csv.DictReader(handle) if r.get("train/loss")]
    assert len(rows) == 2
    if track == "tool":
        assert all(float(r["train/completion_length_mean"]) > 10 for r in rows)  # multi-token turns
    with open(tmp_path / f"runs/qwen3_{track}_grpo/version_0/completions.jsonl") as handle:
        prompt = json.loads(handle.readline())["prompt"]
    assert "<|im_start|>assistant\n" in prompt and (track == "tool" or prompt.endswith("<think>\n\n</think>\n\n"))
