"""GRPOModule under Lightning DDP: 2 CPU processes (gloo), launched by Lightning itself.

``strategy="ddp"`` re-executes the running script for the other ranks, which pytest cannot be, so
each test starts the standalone script ``tests/helpers/distributed_worker.py`` in a subprocess (no rank
variables in its environment); Lightning then launches rank 1 from it. The ranks write their
results to files that the tests read.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.runs import communicate_or_kill

WORKER = Path(__file__).resolve().parents[1] / "helpers" / "distributed_worker.py"
#: Variables that would make Lightning believe it runs under an external launcher / cluster.
_LAUNCH_VARS = (
    "LOCAL_RANK",
    "RANK",
    "GLOBAL_RANK",
    "WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)
_LAUNCH_PREFIXES = ("SLURM_", "TORCHELASTIC_", "LSB_", "JSM_", "OMPI_", "PMI_", "PL_")

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")


def _run_worker(
    mode: str, model_dir: Path, out: Path, timeout: float = 300, *extra: str, worker: Path = WORKER
) -> None:
    """Run the worker script (rank 0; Lightning starts rank 1) and fail with its output on error."""
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARS and not k.startswith(_LAUNCH_PREFIXES)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(WORKER.parents[2]), env.get("PYTHONPATH")]))
    cmd = [sys.executable, str(worker), mode, "--model", str(model_dir), "--out", str(out), *extra]
    # own session: on a timeout the whole group (rank 0 and the rank Lightning started) is killed
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    output = communicate_or_kill(proc, timeout, f"the {mode} worker")
    assert proc.returncode == 0, f"{mode} worker failed (rc {proc.returncode}):\n{output[-6000:]}"


def _load(out: Path, mode: str) -> list[dict]:
    files = [out / f"{mode}-rank{r}.pt" for r in range(2)]
    missing = [f.name for f in files if not f.is_file()]
    assert not missing, f"ranks wrote no results: {missing}"
    return [torch.load(f, weights_only=False) for f in files]


#: The engine of the 2-rank full-loop run (``e2e``): vLLM in each rank where installed.
E2E_ENGINE = "vllm" if importlib.util.find_spec("vllm") else "hf"
E2E_STEPS = 3


@pytest.fixture(scope="module")
def ddp_update(tiny_model_path, tmp_path_factory):
    """The ranks' ``update`` results, from one launch of the two ranks that then ran the full loop (``e2e``,
    `test_rollouts_under_ddp_sample_different_prompts_and_seeds_with_current_weights`) too."""
    out = tmp_path_factory.mktemp("ddp-update")
    extra = ["--steps", str(E2E_STEPS), "--engine", E2E_ENGINE, "--policy", "module"]
    _run_worker("update,e2e", tiny_model_path, out, 600, *extra)
    return [{**rank, "out": out} for rank in _load(out, "update")]


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_two_rank_update_equals_one_rank_update_on_the_concatenated_batch(ddp_update, tiny_model_path, aggregation):
    from tests.helpers.distributed_worker import (
        _module,
        rollout_half,
        single_process_update,
    )

    rank0, rank1 = ddp_update
    assert rank0["info"] == {"rank": 0, "backend": "gloo", "world_size": 2}
    assert rank1["info"]["rank"] == 1
    # the halves really differ in what a per-rank normaliser would see
    vocab = _module(str(tiny_model_path), "token_mean").policy.config.vocab_size
    halves = [rollout_half(r, vocab) for r in range(2)]
    assert [h.completion_mask.sum().item() for h in halves] == [17.0, 7.0]
    assert [h.completion_mask.shape[1] for h in halves] == [5, 3]

    before = _module(str(tiny_model_path), aggregation).policy.state_dict()
    reference = single_process_update(str(tiny_model_path), aggregation)
    moved = max((reference[n] - before[n]).abs().max().item() for n in reference)
    assert moved > 1e-3  # the update is visible
    for accumulate in (1, 2):
        for rank, result in enumerate(ddp_update):
            state = result["states"][(aggregation, accumulate)]
            for name in reference:
                torch.testing.assert_close(
                    state[name],
                    reference[name],
                    atol=1e-6,
                    rtol=0,
                    msg=f"{name} (rank {rank}, accumulate {accumulate})",
                )


def test_a_ddp_checkpoint_exports_to_the_trained_weights(ddp_update, tmp_path):
    """``lightning-grpo export`` of the DDP run's checkpoint: a folder that transformers loads with
    exactly the weights both ranks ended with."""
    from transformers import AutoModelForCausalLM

    from lightning_grpo.models.export import export

    checkpoint = ddp_update[0]["out"] / "ddp.ckpt"
    out = export(checkpoint, tmp_path / "exported")
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
    trained = ddp_update[0]["states"][("token_mean", 1)]
    assert set(loaded) == set(trained)
    for name, value in trained.items():
        torch.testing.assert_close(loaded[name], value, atol=0, rtol=0, msg=name)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_two_rank_step_metrics_equal_the_one_rank_metrics(ddp_update, tiny_model_path, aggregation):
    """The logged step metrics (token-weighted means, summed loss, ratio min / max, mismatch max,
    grad norm) are reduced over ranks and micro-batches: both ranks log the 1-process values."""
    from tests.helpers.distributed_worker import single_process_update

    reference: dict[str, float] = {}
    single_process_update(str(tiny_model_path), aggregation, reference)
    for name in ("train/loss", "train/entropy", "train/ratio_max", "train/mismatch_max_abs", "train/grad_norm"):
        assert name in reference, name
    for accumulate in (1, 2):
        for rank, result in enumerate(ddp_update):
            logged = result["metrics"][(aggregation, accumulate)]
            assert logged.keys() == reference.keys()
            for name, value in reference.items():
                assert logged[name] == pytest.approx(value, abs=2e-6, rel=1e-5), (
                    f"{name} (rank {rank}, accumulate {accumulate})"
                )


def test_a_skip_asked_by_one_rank_is_taken_by_all(ddp_update, tiny_model_path):
    from tests.helpers.distributed_worker import _module

    before = _module(str(tiny_model_path), "token_mean").policy.state_dict()
    for rank, result in enumerate(ddp_update):
        assert result["metrics"][("skip_on_rank_1", 1)] == {"skipped_steps": 1}, rank
        state = result["states"][("skip_on_rank_1", 1)]
        assert all(torch.equal(state[n], before[n]) for n in before), f"rank {rank} updated its weights"


def test_the_entropy_controller_takes_rank_zeros_decision_on_every_rank(ddp_update):
    for rank, result in enumerate(ddp_update):
        assert result["metrics"][("entropy_control", 1)] == {"entropy_coef": 0.005, "moves": 1}, rank


def test_per_rank_counts_would_give_a_different_update(ddp_update, tiny_model_path):
    """Control: the comparison above detects a module that normalises by its own rank's tokens."""
    from tests.helpers.distributed_worker import single_process_update

    reference = single_process_update(str(tiny_model_path), "token_mean")
    local = ddp_update[0]["states"][("token_mean_local_counts", 1)]
    gap = max((local[n] - reference[n]).abs().max().item() for n in reference)
    assert gap > 1e-4


def _check_e2e(ranks: list[dict], steps: int) -> None:
    from lightning_grpo.rollout.base import derive_seed

    for rank, r in enumerate(ranks):
        assert r["rank"] == rank and r["world_size"] == 2
        assert r["global_step"] == steps and r["generations"] == steps
        # the callback asked the schedule for (generation g, this rank, world 2) ...
        assert [(p["generation"], p["rank"], p["world_size"], p["round"]) for p in r["prompts"]] == [
            (g, rank, 2, 0) for g in range(steps)
        ]
        # ... and sampled each generation with derive_seed(seed, rank, g * max_rounds)
        assert [c["seed"] for c in r["calls"]] == [derive_seed(7, rank, g * 4) for g in range(steps)]
        assert all(len(c["prompt_ids"]) == 4 and c["n"] == 4 for c in r["calls"])
        assert r["rollout_rows"] == 16
        assert [c["ranks"] for c in r["checks"]] == [2.0] * steps  # the default group spans both ranks
    for step in range(steps):  # rollout statistics are logged over both ranks, identically
        local = [r["checks"][step]["local_reward_mean"] for r in ranks]
        for r in ranks:
            assert r["checks"][step]["logged_reward_mean"] == pytest.approx(sum(local) / 2, abs=1e-6)
            assert r["checks"][step]["logged_length_max"] == max(q["checks"][step]["local_length_max"] for q in ranks)
    seeds = [c["seed"] for r in ranks for c in r["calls"]]
    assert len(set(seeds)) == len(seeds)  # distinct per rank and generation
    for g in range(steps):
        p0, p1 = (set(r["prompts"][g]["prompts"]) for r in ranks)
        assert not p0 & p1, f"generation {g}: both ranks sampled {p0 & p1}"
        ids0, ids1 = (r["calls"][g]["prompt_ids"] for r in ranks)
        assert ids0 != ids1
    # DDP kept the replicas identical, and training moved them
    after0, after1 = ranks[0]["after"], ranks[1]["after"]
    for name in after0:
        torch.testing.assert_close(after0[name], after1[name], atol=0, rtol=0, msg=name)
    moved = max((after0[n] - ranks[0]["before"][n]).abs().max().item() for n in after0)
    assert moved > 0


def test_rollouts_under_ddp_sample_different_prompts_and_seeds_with_current_weights(ddp_update):
    """The full loop on 2 ranks: each rank samples its own prompts with its own seeds, the logged rollout
    statistics are reduced over both, and each rank's engine samples with the policy's current weights.
    With vLLM installed each rank builds its own in-process vLLM engine inside the fit (after Lightning set up
    the gloo group; vLLM joins it instead of creating one) from the policy module and pushes its weights after
    every step; without it, the HF engine samples from the live policy. (The HF engine under DDP with vLLM
    installed: the matrix's ddp2-hf cell.)"""
    ranks = _load(ddp_update[0]["out"], f"e2e-{E2E_ENGINE}")
    _check_e2e(ranks, E2E_STEPS)
    for r in ranks:  # the engine samples with the policy's current weights on every rank
        assert max(c["logprob_gap"] for c in r["checks"]) < 1e-4, r["checks"]


@pytest.mark.vllm
def test_vllm_server_shared_by_ddp_ranks_rank0_pushes(vllm_server, tiny_model_path, tmp_path):
    """Both ranks sample on the session's server; rank 0 alone pushes after every optimizer step,
    rank 1 waits until the server reports the new version, and both sample with current weights.
    The server first holds an earlier run's push (other weights, version 50): rank 1 must not take
    it for this run's first push (it did when versions restarted at 0 on a reused server)."""
    _push_other_weights(vllm_server, tiny_model_path, version=50)
    steps = 3
    _run_worker(
        "e2e", tiny_model_path, tmp_path, 400, "--steps", str(steps), "--engine", "vllm_server", "--url", vllm_server
    )
    ranks = _load(tmp_path, "e2e-vllm_server")
    _check_e2e(ranks, steps)
    assert ranks[0]["pushes"] == [True] * steps and ranks[1]["pushes"] == [False] * steps
    for r in ranks:
        assert max(c["logprob_gap"] for c in r["checks"]) < 1e-4, r["checks"]


def _push_other_weights(url: str, model_dir: Path, version: int) -> None:
    """What an earlier run leaves on a server: its own weights (here the tiny model's, perturbed) as ``version``."""
    from transformers import AutoModelForCausalLM

    from lightning_grpo.rollout.server_client import ServerClient
    from lightning_grpo.rollout.server_engine import ServerEngine

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    gen = torch.Generator().manual_seed(0)
    engine = ServerEngine([ServerClient(url)])
    try:
        engine.load_weights(
            ((n, p.detach() + 0.5 * torch.randn(p.shape, generator=gen)) for n, p in model.named_parameters()), version
        )
        assert ServerClient(url).weight_version() == str(version)
    finally:
        engine.close()
