"""benchmarks/trl_tables.py: bench_trl.py --write puts its tables between the shape's markers of a
page, from the results dict alone (no TRL needed), and names the page and marker when they are missing."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def trl_tables(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import trl_tables

    return trl_tables


def results(prompt_tokens: int = 0) -> dict:
    return {
        "command": "PYTHONPATH=/tmp/trl-pkgs python benchmarks/bench_trl.py --rounds 2",
        "machine": "Test CPU, 2 cores",
        "note": "The other core was busy.",
        "rounds": 2, "steps": 12, "skip": 3,
        "shape": {"prompt_tokens": prompt_tokens, "max_new": 64, "prompts": 8, "lr": 1e-4},
        "step_medians": {"trl-hf": [4.0, 5.0], "trl-vllm": [2.0, None], "ours-vllm": [1.5, 2.5]},
        "cpu_medians": {"trl-hf": [3.9, 4.9], "trl-vllm": [1.9, None], "ours-vllm": [1.4, 2.4]},
        "lengths": {"trl-hf": [36.0, 35.0], "trl-vllm": [29.3, None], "ours-vllm": [44.4, 44.8]},
        "phase_medians": {
            "trl-hf": [{"rollout": 1.6, "rest": 2.4}, {"rollout": 1.8, "rest": 3.2}],
            "trl-vllm": [{"rollout": 0.9, "rest": 1.1, "sync": 0.031}, None],
            "ours-vllm": [{"rollout": 0.9, "rest": 0.6, "sync": 0.015, "generate": 0.8, "forward": 0.2, "backward": 0.4}] * 2,
        },
        "sync_checks": [{"tensors": 11, "stale_tensor_gap": 0.05, "synced_tensor_gap": 0.0, "stale_logprob_gap": 1.7,
                         "synced_logprob_gap": 0.004, "engine_dtype": "torch.bfloat16"}],
    }  # fmt: skip


def test_write_replaces_only_the_shape_block(trl_tables, tmp_path):
    page = tmp_path / "benchmarks.md"
    step, long = trl_tables.MARKERS["digit"], trl_tables.MARKERS["long"]
    page.write_text(f"intro\n{step}\nold step table\n{step}\nmiddle\n{long}\nold long table\n{long}\nend\n")
    trl_tables.write_tables(results(), page)
    text = page.read_text()
    block = text.split(step)[1]
    assert "old step table" not in text and "old long table" in text
    assert text.startswith("intro\n") and "\nmiddle\n" in text and text.endswith("end\n")
    rows = {line.split(" | ")[0]: line for line in block.splitlines() if line.startswith("| ")}
    # ours-vllm over TRL vLLM colocate: only round 1 has both (1.5 / 2.0); over TRL HF: 1.5/4, 2.5/5
    assert rows["| ours, vLLM engine"].endswith("| 0.44 (0.38-0.50) | 0.75 | 0.42 (0.36-0.49) | 0.74 |")
    assert "| TRL `GRPOTrainer`, vLLM colocate (shim) | 29.3 | 2.00 | 2.00, failed |" in block
    assert "/ TRL HF generate | / TRL vLLM colocate (shim) |" in block
    assert "| weight push (inside the rollout) | 0 | 0.031 | 0.015 |" in block
    assert "The other core was busy." in block and "torch.bfloat16" in block
    trl_tables.write_tables(results(), page)
    assert page.read_text() == text  # writing again gives the same page

    trl_tables.write_tables(results(prompt_tokens=512), page)
    assert "old long table" not in page.read_text() and page.read_text().split(step)[1] == block


def test_missing_markers_name_the_page_and_marker(trl_tables, tmp_path):
    page = tmp_path / "benchmarks.md"
    page.write_text(f"only one {trl_tables.MARKERS['long']}\n")
    with pytest.raises(SystemExit, match=r"benchmarks\.md needs two <!-- trl-long-results --> markers"):
        trl_tables.write_tables(results(prompt_tokens=512), page)
    assert page.read_text() == f"only one {trl_tables.MARKERS['long']}\n"


@pytest.mark.vllm
def test_trl_sync_shim_moves_the_engine_and_its_check_catches_a_stale_one(vllm_engine, tiny_model_path, monkeypatch):
    """benchmarks/trl_vllm_shim.py on the session's engine, behind a stand-in for the part of TRL's
    VLLMGeneration it touches (no TRL needed): the patched push moves the engine to the policy, and
    check_synced fails a push that leaves the engine as it was."""
    import torch
    from transformers import AutoModelForCausalLM

    from lightning_grpo.rollout.vllm_push import repack_plain_layers

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import trl_vllm_shim

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    vllm_engine.load_weights(list(model.named_parameters()))  # the engine starts as the policy
    if vllm_engine._plain_kernels:  # reload_weights, which the shim calls, expects vLLM's packed layout
        vllm_engine.llm.apply_model(repack_plain_layers)
        vllm_engine._plain_kernels = False

    class Generation:  # TRL's VLLMGeneration, as far as the shim reads it
        mode, enable_sleep_mode, llm = "colocate", False, vllm_engine.llm

        def sync_weights(self):
            raise AssertionError("TRL's own push ran")

        def _iter_named_params(self):
            yield from ((name, param.data) for name, param in model.named_parameters())

    syncs: list[float] = []
    trl_vllm_shim.patch_colocate_sync(Generation, syncs)
    check = trl_vllm_shim.check_synced(Generation(), model, [5, 6, 7, 8, 9, 10])
    assert len(syncs) == 1 and check["synced_tensor_gap"] == 0 < check["stale_tensor_gap"]
    assert check["synced_logprob_gap"] < 1e-4 < check["stale_logprob_gap"]  # float32 engine

    Generation.sync_weights = lambda self: None  # a push that silently does nothing
    with pytest.raises(RuntimeError, match="the sync did not move the engine to the policy"):
        trl_vllm_shim.check_synced(Generation(), model, [5, 6, 7, 8, 9, 10])
