"""GRPOModule sharded with FSDP2 (Lightning ModelParallelStrategy, 2 CPU processes, gloo): the
chunked log-prob path trains correctly sharded, and the vLLM push gathers the full weights.

The ranks run in tests/helpers/fsdp2_worker.py (started like tests/helpers/distributed_worker.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from tests.e2e.test_distributed import _run_worker

WORKER = Path(__file__).resolve().parents[1] / "helpers" / "fsdp2_worker.py"

pytestmark = [
    pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available"),
    pytest.mark.slow,
]


#: The worker's modes, all in one launch of the two ranks (each start costs the imports and the rendezvous).
MODES = ["update", "prefix", *(["e2e"] if importlib.util.find_spec("vllm") else [])]
E2E_STEPS = 3


@pytest.fixture(scope="module")
def fsdp2_runs(tiny_model_path, tmp_path_factory) -> Path:
    """The folder of one 2-rank worker launch that ran every mode (``<mode>-rank<r>.pt``, ``update.ckpt``)."""
    out = tmp_path_factory.mktemp("fsdp2")
    _run_worker(",".join(MODES), tiny_model_path, out, 600, "--steps", str(E2E_STEPS), worker=WORKER)
    return out


def _ranks(out: Path, mode: str) -> list[dict]:
    return [torch.load(out / f"{mode}-rank{r}.pt", weights_only=False) for r in range(2)]


def _check_sharded(result: dict) -> None:
    assert result["units"] == 3  # two decoder layers and the root
    assert result["dtensor_params"] == result["params"] > 0  # every parameter is a shard
    assert result["chunked_forward_registered"]  # the chunked path ran as a root forward, no fallback


def test_fsdp2_update_equals_one_process_update(fsdp2_runs, tiny_model_path, tmp_path):
    from tests.helpers.distributed_worker import _module, single_process_update

    ranks = _ranks(fsdp2_runs, "update")
    reference = single_process_update(str(tiny_model_path), "token_mean")
    before = _module(str(tiny_model_path), "token_mean").policy.state_dict()
    assert max((reference[n] - before[n]).abs().max().item() for n in reference) > 1e-3
    for rank, result in enumerate(ranks):
        assert (result["rank"], result["world"], result["step"]) == (rank, 2, 1)
        _check_sharded(result)
        for name in reference:  # embeddings and LM head (root unit) included: their gradients were reduced
            torch.testing.assert_close(
                result["state"][name], reference[name], atol=1e-6, rtol=0, msg=f"{name} rank {rank}"
            )
    _check_export_of_the_sharded_checkpoint(fsdp2_runs / "update.ckpt", tmp_path, ranks[0]["state"])


def _check_export_of_the_sharded_checkpoint(checkpoint: Path, tmp_path: Path, state: dict[str, torch.Tensor]) -> None:
    """``lightning-grpo export`` of the FSDP2 run's distributed checkpoint folder: a model folder that
    transformers loads with exactly the gathered weights."""
    from transformers import AutoModelForCausalLM

    from lightning_grpo.models.export import export

    assert (checkpoint / ".metadata").is_file()
    out = export(checkpoint, tmp_path / "exported")
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
    assert set(loaded) == set(state)
    for name, value in state.items():
        torch.testing.assert_close(loaded[name], value, atol=0, rtol=0, msg=name)


def test_fsdp2_shared_prefix_update_equals_padded_update(fsdp2_runs, tiny_model_path):
    """Sharded, each rank's rows sharing one prompt: the shared-prefix step gives the padded step's weights."""
    from tests.helpers.distributed_worker import module_policy_state

    before = module_policy_state(str(tiny_model_path))
    for result in _ranks(fsdp2_runs, "prefix"):
        _check_sharded(result)
        assert result["shared_tokens"] == 2 * 3  # 3 of the 4 rows share a 3-token prompt
        assert max((result["off"][n] - before[n]).abs().max().item() for n in before) > 1e-3
        for name, padded in result["off"].items():
            torch.testing.assert_close(result["on"][name], padded, atol=1e-5, rtol=0, msg=name)


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm")
def test_fsdp2_vllm_push_gathers_full_weights(fsdp2_runs, tiny_model_path):
    """After each optimizer step every rank gathers the shards and pushes into its own engine: the
    engine's log-probs of its next samples equal the sharded policy's (a stale or shard-sized push
    would be off by far more, or fail)."""
    steps = E2E_STEPS
    ranks = _ranks(fsdp2_runs, "e2e")
    from tests.helpers.distributed_worker import module_policy_state

    before = module_policy_state(str(tiny_model_path))
    for _rank, result in enumerate(ranks):
        assert result["step"] == steps
        _check_sharded(result)
        assert result["reference_units"] == 3  # the frozen reference (beta > 0) is sharded too
        assert [c["step"] for c in result["checks"]] == list(range(steps))
        assert max(c["gap"] for c in result["checks"]) < 1e-4, result["checks"]
        moved = max((result["state"][n] - before[n]).abs().max().item() for n in before)
        assert moved > 1e-4  # the pushes after steps 1 and 2 carried updated weights
    for name, value in ranks[0]["state"].items():
        torch.testing.assert_close(ranks[1]["state"][name], value, atol=0, rtol=0, msg=name)
