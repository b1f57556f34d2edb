"""``lightning-grpo export`` and SavePretrained: a trained policy as a Hugging Face model folder.

Round trips train a recipe for a few steps with the session's vLLM engine (validation at the last
step), export the run's ``last.ckpt`` and check the folder:

* transformers: ``AutoModelForCausalLM`` / ``AutoTokenizer`` on the folder give the trained policy's
  log-probs of a fixed sequence (1e-5, float32) and the run's tokenizer (chat template included);
* vLLM: the folder's weights (``model.safetensors``) pushed into the session's engine, or its adapter
  served with a ``LoRARequest``, give the run's last ``val/greedy_accuracy`` exactly (the runs start
  from the digit teacher, so it is far from chance) and the trained policy's log-probs of sampled
  completions (1e-4); that vLLM reads
  the folder's config, tokenizer and generation config is checked with ``EngineArgs`` (no second
  engine), and one slow test loads the folder with ``vllm.LLM`` in a child process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lightning_grpo.models.export import ExportError, export, find_checkpoint
from tests.helpers.export import (
    sequence_logprobs as _sequence_logprobs,
    vllm_reads as _vllm_reads,
    vllm_serves_the_policy,
)
from tests.helpers.runs import train_recipe as _train

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("tiny_cache")
#: Held-out greedy accuracy the runs started from the digit teacher keep (chance is about 0.1).
TRAINED = 0.8


def _check_tokenizer(folder: Path, trained) -> None:
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(folder)
    assert loaded("1234=")["input_ids"] == trained("1234=")["input_ids"] != []
    assert loaded.eos_token_id == trained.eos_token_id and loaded.chat_template == trained.chat_template


# ------------------------------------------------------------------------------ round trips
@pytest.mark.vllm
@pytest.mark.slow
def test_quickstart_checkpoint_round_trip(tmp_path, vllm_engine, digit_teacher_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    built, run_dir = _train(
        tmp_path, "quickstart.yaml", 8, engine=vllm_engine, extra=[f"--model.model={digit_teacher_path}"]
    )
    out = export(tmp_path / "runs" / "run", tmp_path / "model")  # the run folder: its latest version, last.ckpt
    assert sorted(p.name for p in out.iterdir()) == [
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    trained = _sequence_logprobs(built.model.policy, built.datamodule.tokenizer)
    torch.testing.assert_close(_sequence_logprobs(loaded, built.datamodule.tokenizer), trained, atol=1e-5, rtol=0)
    _check_tokenizer(out, built.datamodule.tokenizer)
    assert (
        json.loads((out / "generation_config.json").read_text())["eos_token_id"]
        == built.datamodule.tokenizer.eos_token_id
    )
    _vllm_reads(out)
    vllm_serves_the_policy(vllm_engine, out, built, run_dir, min_accuracy=TRAINED)
    # bfloat16: the config says so and every tensor is bfloat16
    half = export(run_dir, tmp_path / "model-bf16", dtype="bfloat16")
    assert json.loads((half / "config.json").read_text())["dtype"] == "bfloat16"
    assert {t.dtype for t in load_file(half / "model.safetensors").values()} == {torch.bfloat16}


#: The LoRA settings of the round trip: grpo_lora.yaml as written (the tiny model's lm_head trained in full,
#: peft modules_to_save, which vLLM does not serve as an adapter) and adapters alone (vLLM serves the adapter).
LORA_RUNS = {"as_written": ([], 12), "adapters_only": (["--model.policy.lora.extra={}"], 6)}


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("variant", list(LORA_RUNS))
def test_lora_checkpoint_round_trip_merged_and_adapter(tmp_path, vllm_engine, digit_teacher_path, variant):
    """From the digit teacher (held-out accuracy ~1): the adapter's few steps are small next to the
    base, so the log-prob checks (1e-5 transformers, 1e-4 vLLM) are what show an unmerged adapter."""
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    extra, steps = LORA_RUNS[variant]
    built, run_dir = _train(
        tmp_path, "grpo_lora.yaml", steps, engine=vllm_engine, extra=[*extra, f"--model.model={digit_teacher_path}"]
    )
    tokenizer = built.datamodule.tokenizer
    trained = _sequence_logprobs(built.model.policy, tokenizer)
    merged = export(run_dir, tmp_path / "merged")
    assert not any("lora" in name for name in load_file(merged / "model.safetensors"))
    torch.testing.assert_close(
        _sequence_logprobs(AutoModelForCausalLM.from_pretrained(merged), tokenizer), trained, atol=1e-5, rtol=0
    )
    vllm_serves_the_policy(vllm_engine, merged, built, run_dir, min_accuracy=TRAINED)

    adapter = export(run_dir, tmp_path / "adapter", adapter=True)
    config = json.loads((adapter / "adapter_config.json").read_text())
    # the base (a local folder) is written into the adapter's folder and named relative to the folder above it
    assert config["r"] == 8 and config["base_model_name_or_path"] == "adapter/base"
    assert config["modules_to_save"] == (["lm_head"] if variant == "as_written" else None)
    base = AutoModelForCausalLM.from_pretrained(tmp_path / config["base_model_name_or_path"])
    peft_model = PeftModel.from_pretrained(base, adapter)
    torch.testing.assert_close(_sequence_logprobs(peft_model, tokenizer), trained, atol=1e-5, rtol=0)
    _check_tokenizer(adapter, tokenizer)
    if config[
        "modules_to_save"
    ]:  # vLLM refuses such an adapter ("Unsupported modules_to_save"): the merged folder above
        return
    vllm_engine.load_weights(list(load_file(adapter / "base" / "model.safetensors").items()))  # the base, as trained
    vllm_engine.load_lora_adapter(str(adapter))
    try:
        vllm_serves_the_policy(vllm_engine, None, built, run_dir, min_accuracy=TRAINED)
    finally:
        vllm_engine.unload_lora_adapter()


@pytest.mark.vllm
@pytest.mark.slow
def test_exported_folder_loads_in_vllm_llm(tmp_path):
    """``vllm.LLM(folder)`` itself (a child process: the suite keeps one in-process engine) answers the
    held-out prompts greedily as the trained policy does with transformers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    built, run_dir = _train(tmp_path, "quickstart.yaml", 8)  # HF engine: no vLLM in this process for the run
    out = export(run_dir, tmp_path / "model")
    prompts = [r["prompt"] for r in built.datamodule.val_records[:16]]
    script = (
        "import json, sys; from vllm import LLM, SamplingParams\n"
        "llm = LLM(sys.argv[1], dtype='float32', max_model_len=64, kv_cache_memory_bytes=32 * 2**20, enforce_eager=True)\n"
        "outs = llm.generate(json.loads(sys.argv[2]), SamplingParams(temperature=0, max_tokens=2))\n"
        "print('RESULT ' + json.dumps([o.outputs[0].text for o in outs]))\n"
    )
    env_note = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TORCHDYNAMO_DISABLE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", script, str(out), json.dumps(prompts)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**__import__("os").environ, **env_note},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    texts = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])
    model, tokenizer = AutoModelForCausalLM.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    expected = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        new = model.generate(ids, max_new_tokens=2, do_sample=False)[0, ids.shape[1] :]
        expected.append(tokenizer.decode(new, skip_special_tokens=True))
    assert texts == expected


# ------------------------------------------------------------------------------ bad input
def test_export_bad_input_one_error_nothing_written(tmp_path, capsys):
    from lightning_grpo.cli import main

    (tmp_path / "run" / "version_0").mkdir(parents=True)
    (tmp_path / "run" / "version_0" / "metrics.csv").write_text("step\n")
    (tmp_path / "notes.ckpt").write_text("not a checkpoint")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    cases = [
        (tmp_path / "nowhere", "no such file or folder"),
        (tmp_path / "notes.ckpt", "is not a Lightning checkpoint"),
        (tmp_path / "run", "holds no checkpoint (no checkpoints/*.ckpt): the run kept none"),
        (tmp_path / "full", "is neither a Lightning checkpoint nor a run directory"),
    ]
    for source, message in cases:
        with pytest.raises(SystemExit) as exit_:
            main(["export", str(source), "--out", str(tmp_path / "out")])
        assert exit_.value.code == 2
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert last.startswith("lightning-grpo export: error: ") and message in last, last
        assert not (tmp_path / "out").exists()
    with pytest.raises(ExportError, match=r"--out .*full is not empty: choose a new folder, or pass --force"):
        export(tmp_path / "run", tmp_path / "full")
    assert (tmp_path / "full" / "keep.txt").exists()


def test_export_an_hf_engine_run_from_the_command_line(tmp_path, capsys):
    """A quickstart run (HF engine, 3 steps) keeps last.ckpt; ``lightning-grpo export`` writes the folder,
    ``--adapter`` on a full fine-tuning run is refused, so is a non-empty folder without ``--force``; ``--force`` replaces."""
    from transformers import AutoModelForCausalLM

    from lightning_grpo.cli import main

    built, run_dir = _train(tmp_path, "quickstart.yaml", 3)
    assert find_checkpoint(tmp_path / "runs" / "run") == run_dir / "checkpoints" / "last.ckpt"
    assert main(["export", str(run_dir), "--out", str(tmp_path / "m")]) == 0
    assert "exported the policy (27 tensors)" in capsys.readouterr().out
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    for name, value in built.model.policy.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], value, atol=0, rtol=0)
    with pytest.raises(SystemExit):
        main(["export", str(run_dir), "--out", str(tmp_path / "a"), "--adapter"])
    assert "trained without model.policy.lora" in capsys.readouterr().err and not (tmp_path / "a").exists()
    written = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "m").iterdir()}
    with pytest.raises(SystemExit) as exit_:  # a non-empty --out without --force: one line, last; the folder untouched
        main(["export", str(run_dir), "--out", str(tmp_path / "m")])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"lightning-grpo export: error: --out {tmp_path / 'm'} is not empty: choose a new folder, or pass --force to replace it"
    )
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "m").iterdir()} == written
    assert main(["export", str(run_dir), "--out", str(tmp_path / "m"), "--force", "--dtype", "float16"]) == 0
    assert json.loads((tmp_path / "m" / "config.json").read_text())["dtype"] == "float16"


# ------------------------------------------------------------------------------ the callback
def test_save_pretrained_every_n_steps_keeps_the_last_k(tmp_path):
    """SavePretrained every 2 steps of a 5-step run, keeping 2: ``model`` holds step 5 (the end),
    ``model-step4`` the save before; each folder loads and holds the policy of its step."""
    from transformers import AutoModelForCausalLM

    from lightning_grpo.callbacks.save_pretrained import STEP_FILE

    out = tmp_path / "model"
    save = {
        "class_path": "lightning_grpo.SavePretrained",
        "init_args": {"dirpath": str(out), "every_n_steps": 2, "keep_last": 2},
    }
    built, _ = _train(tmp_path, "quickstart.yaml", 5, extra=[f"--trainer.callbacks+={json.dumps(save)}"])
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("model")) == ["model", "model-step4"]
    assert json.loads((out / STEP_FILE).read_text()) == {"global_step": 5}
    assert json.loads((tmp_path / "model-step4" / STEP_FILE).read_text()) == {"global_step": 4}
    loaded = AutoModelForCausalLM.from_pretrained(out)
    for name, value in built.model.policy.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], value, atol=0, rtol=0)
    _check_tokenizer(out, built.datamodule.tokenizer)


def test_save_pretrained_refuses_a_folder_that_is_not_a_model(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "metrics.csv").write_text("step\n")
    save = {"class_path": "lightning_grpo.SavePretrained", "init_args": {"dirpath": str(tmp_path / "logs")}}
    with pytest.raises(ValueError, match=r"SavePretrained.dirpath '.*logs' exists and is not a saved model directory"):
        _train(tmp_path, "quickstart.yaml", 1, extra=[f"--trainer.callbacks+={json.dumps(save)}"])
    assert (tmp_path / "logs" / "metrics.csv").exists()


def test_a_checkpoints_policy_runs_as_the_trained_model(tiny_model_path):
    """build_policy assigns a checkpoint's tensors to a model made on the meta device; the rotary
    ``inv_freq`` is in no state dict, so it is rebuilt: the policy's forward equals the source's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lightning_grpo.models.export import build_policy

    source = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    with torch.no_grad():
        for p in source.parameters():  # not the saved weights: the checkpoint's own must be the ones used
            p.add_(0.01 * torch.randn_like(p))
    weights = {k: v.clone() for k, v in source.state_dict().items()}
    policy = build_policy(weights, {"config": source.config.to_dict(), "lora": None})
    assert not any(b.is_meta for b in policy.buffers())
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    expected = _sequence_logprobs(source, tokenizer)
    assert expected.abs().max() > 0.1
    torch.testing.assert_close(_sequence_logprobs(policy, tokenizer), expected, atol=1e-6, rtol=0)
