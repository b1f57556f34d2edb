"""Pieces of ``engine: vllm_server`` that need no server: shared-memory buckets, settings,
the asynchronous pipeline's ordering and staleness bound. The vLLM plugin's entry point:
tests/package/test_vllm_entry.py."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from lightning_grpo.callbacks.async_rollout import AsyncRollout, VersionRecorder, staleness_metrics
from lightning_grpo.rollout.shm_transfer import plan_buckets, read_bucket, write_buckets
from lightning_grpo.rollout.vllm_server import ServerLaunch, ServerSettings


def test_plan_buckets_fills_up_to_the_limit_and_isolates_large_tensors():
    # 64-byte alignment: sizes 100 -> 128, 30 -> 64, 500 -> 512
    assert plan_buckets([100, 30, 100, 500, 30], bucket_bytes=256) == [[0, 1], [2], [3], [4]]
    assert plan_buckets([10] * 4, bucket_bytes=1 << 20) == [[0, 1, 2, 3]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_buckets_round_trip_names_shapes_values(tmp_path, dtype):
    weights = [("a.weight", torch.randn(3, 5)), ("b.bias", torch.randn(7)), ("c", torch.randn(2, 2, 2))]
    buckets = write_buckets(weights, dtype, bucket_bytes=64, directory=str(tmp_path))
    assert len(buckets.update_infos) == 3  # each tensor is larger than 64 bytes: one bucket each
    read = {}
    for info in buckets.update_infos:
        read.update(read_bucket(info["path"], info["names"], info["dtype"], info["shapes"], info["offsets"]))
    assert list(read) == ["a.weight", "b.bias", "c"]
    for name, tensor in weights:
        assert read[name].dtype == dtype and read[name].shape == tensor.shape
        assert torch.equal(read[name], tensor.to(dtype))
    buckets.unlink()
    assert not any(tmp_path.iterdir())


def test_server_settings_reject_bad_values_with_the_field_name():
    with pytest.raises(ValueError, match="rollout.engine.init_args.urls: 'localhost:8000' is not an http"):
        ServerSettings(urls=["localhost:8000"])
    with pytest.raises(ValueError, match="rollout.engine.init_args.launch.num_servers must be >= 1"):
        ServerLaunch(num_servers=0)
    with pytest.raises(
        ValueError, match=r"rollout.engine.init_args.max_model_len must be an integer >= 1 or null, got 0"
    ):
        ServerSettings(max_model_len=0)


class _Log:
    """Records the order in which the pipeline's worker runs pushes and generations."""

    def __init__(self):
        self.events: list[tuple[str, int]] = []
        self.server_version = -1
        self.lock = threading.Lock()

    def push(self, payload, step):
        time.sleep(0.01)
        with self.lock:
            self.server_version = payload
            self.events.append(("push", step))

    def sample(self, generation):
        with self.lock:
            self.events.append(("gen", generation))
            return {
                "generation": generation,
                "weight_version_min": float(self.server_version),
                "weight_version_mean": float(self.server_version),
            }


@pytest.mark.parametrize("k, per_gen", [(1, 1), (2, 1), (1, 2)])
def test_async_pipeline_never_exceeds_the_staleness_bound(k, per_gen):
    log = _Log()
    pipeline = AsyncRollout(k, per_gen, prepare_push=lambda step: step, send_push=log.push, sample=log.sample)
    worst = []
    for step in range(0, 8 * per_gen, per_gen):  # the first optimizer step of each generation batch
        result, times = pipeline.next_batch(step // per_gen, step)
        assert result["generation"] == step // per_gen
        worst.append(staleness_metrics(result, step, k)["staleness_max"])
    pipeline.close()
    # batch g is queued at the first step s (a multiple of P) with g*P - s <= k, with the weights of s
    first = [max(0, -(-(g * per_gen - k) // per_gen) * per_gen) for g in range(8)]
    expected = [g * per_gen - s for g, s in enumerate(first)]
    assert worst == expected
    assert max(worst) <= k
    # every generation was queued after the push of the weights it used, and never before it
    for i, (kind, value) in enumerate(log.events):
        if kind == "gen":
            pushes = [v for kd, v in log.events[:i] if kd == "push"]
            assert pushes and value * per_gen - pushes[-1] <= k


def test_staleness_check_raises_on_a_batch_older_than_the_bound():
    assert staleness_metrics({"weight_version_min": 3.0, "weight_version_mean": 3.5}, 4, 1) == {
        "staleness_max": 1.0,
        "staleness_mean": 0.5,
    }
    with pytest.raises(RuntimeError, match="staleness 2 > max_staleness 1"):
        staleness_metrics({"weight_version_min": 2.0, "weight_version_mean": 2.0}, 4, 1)
    assert staleness_metrics({}, 4, 1) == {}


def test_async_pipeline_surfaces_a_failed_push():
    def broken_push(payload, step):
        raise ConnectionError("server gone")

    pipeline = AsyncRollout(1, 1, prepare_push=lambda s: s, send_push=broken_push, sample=lambda g: g)
    with pytest.raises(ConnectionError, match="server gone"):
        pipeline.next_batch(0, 0)
    pipeline.close()


def test_version_recorder_collects_versions_of_every_call():
    from lightning_grpo.rollout.base import Rollout, RolloutEngine

    class Engine(RolloutEngine):
        def generate(self, prompts, sampling, seed):
            return Rollout(
                [list(p) for p in prompts],
                [[1]] * len(prompts),
                [[0.0]] * len(prompts),
                [True] * len(prompts),
                group_size=1,
                versions=[seed] * len(prompts),
            )

        def load_weights(self, weights, version=None):
            pass

    recorder = VersionRecorder(Engine())
    recorder.generate([[1], [2]], None, 4)
    recorder.generate([[1]], None, 6)
    assert recorder.metrics() == {"weight_version_min": 4.0, "weight_version_mean": 14 / 3}


class _VersionedServer:
    """A stand-in ServerClient: reports a weight version, records pushes, samples one fixed token."""

    def __init__(self, url: str, version: str) -> None:
        self.url, self.version, self.pushed = url, version, []
        self.transfer_ready, self.inits = False, 0  # ServerClient's transfer state (shm: no rendezvous)

    def healthy(self) -> bool:
        return True

    def init_transfer(self, init_info: dict) -> None:
        self.transfer_ready, self.inits = True, self.inits + 1

    def weight_version(self) -> str:
        return self.version

    def push(self, update_infos, version: int) -> None:
        self.pushed.append(version)
        self.version = str(version)

    def generate(self, prompt_ids, params):
        from lightning_grpo.rollout.server_client import Sample

        return [Sample([7], [-0.5], True, int(self.version))] * params["n"]


def test_a_run_on_reused_servers_numbers_its_pushes_above_the_versions_they_hold(monkeypatch):
    """A server an earlier run pushed to reports that run's last version (50 here). A new run reads
    it once (rank 0, shared by the strategy's broadcast), pushes 51, 52, ...; a waiting rank does
    not take the old 50 for this run's version 0; samples carry this run's numbering."""
    from lightning_grpo.rollout import vllm_server
    from lightning_grpo.rollout.base import SamplingConfig

    servers = {"http://a": _VersionedServer("http://a", "50"), "http://b": _VersionedServer("http://b", "-1")}
    monkeypatch.setattr(vllm_server, "ServerClient", lambda url, timeout: servers[url])
    settings = ServerSettings(urls=list(servers))
    sent = []
    pusher = vllm_server.build_server_engine(settings, None, 0, "unused", lambda obj: sent.append(obj) or obj)
    waiter = vllm_server.build_server_engine(settings, None, 1, "unused", lambda obj: sent[0])
    assert sent == [51] and pusher.version_base == waiter.version_base == 51
    waiter.version_timeout = 0.2
    with pytest.raises(TimeoutError, match="waited for 51 .version 0 of this run"):
        waiter.load_weights([], version=0)  # still the earlier run's 50
    pusher.load_weights([("w", torch.zeros(2))], version=0)
    assert [s.pushed for s in servers.values()] == [[51], [51]]
    assert [s.inits for s in servers.values()] == [1, 1]  # the transport set each server up once
    waiter.load_weights([], version=0)  # returns at once: every server reports 51
    out = waiter.generate([[1, 2]], SamplingConfig(n=2, max_new_tokens=1), seed=0)
    assert out.versions == [0, 0]
    servers["http://a"].version = "50"  # an older push than this run's: not one of its versions
    assert waiter.generate([[1, 2]], SamplingConfig(n=1, max_new_tokens=1), seed=0).versions == [-1]
    assert vllm_server._next_version([_VersionedServer("u", "-1")]) == 0  # a fresh server
