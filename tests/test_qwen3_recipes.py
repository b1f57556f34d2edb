"""The two-stage Qwen3 tool recipes (recipes/qwen3_tool_sft.yaml, then recipes/qwen3_tool_grpo.yaml) on the real
Qwen3 tokenizer: stage 1 writes a run folder, stage 2 starts from it as written (model.model: runs/qwen3_tool_sft)
and trains: the call and the tool's answer in real BPE tokens, through the HF engine (the session's vLLM engine
serves the tiny character model)."""

from __future__ import annotations

import csv
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SFT, GRPO = ROOT / "recipes/qwen3_tool_sft.yaml", ROOT / "recipes/qwen3_tool_grpo.yaml"


def test_the_stages_name_each_other_and_ask_the_same_question():
    sft, grpo = (yaml.safe_load(p.read_text()) for p in (SFT, GRPO))
    assert grpo["model"]["model"] == f"runs/{sft['trainer']['logger']['init_args']['name']}"
    assert sft["data"]["source"]["init_args"]["question"] == grpo["rollout"]["init_args"]["environment_args"]["question"]
    assert sft["model"]["model"] == sft["data"]["tokenizer_path"] == grpo["data"]["tokenizer_path"] == "tiny:qwen3"
    assert "lightning-grpo sft fit -c recipes/qwen3_tool_sft.yaml" in GRPO.read_text()


def test_sft_then_grpo_from_its_run_folder(tmp_path, monkeypatch, qwen_tokenizer):
    from lightning_grpo.cli import main

    monkeypatch.chdir(tmp_path)  # stage 2 reads runs/qwen3_tool_sft as written, relative to the working directory
    monkeypatch.setenv("LIGHTNING_GRPO_CACHE", str(tmp_path / "cache"))
    quiet = ["--trainer.enable_progress_bar", "false", "--trainer.max_steps", "2"]
    main(["sft", "fit", "-c", str(SFT), *quiet, "--data.source.init_args.num_train", "16", "--data.source.init_args.num_val", "4",
          "--data.batch_size", "4"])  # fmt: skip
    assert (tmp_path / "runs/qwen3_tool_sft/version_0/checkpoints/last.ckpt").is_file()
    main(["fit", "-c", str(GRPO), *quiet, "--rollout.init_args.engine", "hf", "--rollout.init_args.vllm_args", "null",
          "--data.batch_size", "1", "--rollout.init_args.sampling.n", "4", "--trainer.log_every_n_steps", "1"])  # fmt: skip
    assert (tmp_path / "runs/qwen3_tool_sft/version_0/checkpoints/last_model/config.json").is_file()  # exported once
    with open(tmp_path / "runs/qwen3_tool_grpo/version_0/metrics.csv") as handle:
        rows = [r for r in csv.DictReader(handle) if r.get("train/loss")]
    assert len(rows) == 2 and all(float(r["train/completion_length_mean"]) > 10 for r in rows)  # multi-token turns
