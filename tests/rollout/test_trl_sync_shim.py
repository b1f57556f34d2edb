"""benchmarks/trl_vllm_shim.py (the TRL comparison's weight push) on the session's vLLM engine: it runs the
library's vLLM weight path (``VLLMEngine.load_weights``, ``repack_plain_layers``), so a change there shows
up here. The benchmark's table writer is not tested."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


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
