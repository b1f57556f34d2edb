"""Weight pushes to vLLM servers on other machines.

TCP (`ServerSettings.transfer` tcp): the server runs in its own IPC and mount namespaces with a private
``/dev/shm`` (``unshare``), so it shares no memory with the trainer, as a server on another machine
would, and talks to it over loopback TCP only. After each push its log-probs equal the trainer's;
without the push they drift apart. NCCL (``transfer: nccl``, vLLM's own backend): the same run with
a GPU server, on a machine with two GPUs (skipped otherwise)."""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest
import torch

from tests.e2e.test_server_training import PushProbe, _fit, _server_callback

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

#: Runs the server in new IPC and mount namespaces, with a fresh tmpfs on /dev/shm.
PRIVATE_SHM = ["unshare", "--ipc", "--mount", "sh", "-c", 'mount -t tmpfs tmpfs /dev/shm && exec "$@"', "private-shm"]


def _can_unshare() -> bool:
    try:
        return subprocess.run([*PRIVATE_SHM, "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="module")
def isolated_server(tiny_model_path, tmp_path_factory):
    """A vLLM server (lightning_grpo_tcp backend) in namespaces of its own; yields its ServerProcess."""
    pytest.importorskip("vllm")
    if not _can_unshare():
        pytest.skip("needs unshare --ipc --mount (root or CAP_SYS_ADMIN) to isolate the server's shared memory")
    from lightning_grpo.rollout.server_client import ServerClient
    from lightning_grpo.rollout.server_process import ServerProcess, free_port

    server = ServerProcess(
        str(tiny_model_path),
        free_port(),
        tmp_path_factory.mktemp("vllm-tcp-server"),
        transfer_backend="lightning_grpo_tcp",
    )
    server.command = [*PRIVATE_SHM, *server.command]
    server.start()
    try:
        server.wait_healthy(300, ServerClient(server.url).healthy)
        yield server
    finally:
        server.stop()


def test_the_server_shares_no_memory_with_the_trainer(isolated_server):
    """Other IPC and mount namespaces: a file the trainer puts in its /dev/shm does not exist for the
    server (the shared-memory transfer cannot work there)."""
    pid = isolated_server.process.pid
    for ns in ("ipc", "mnt"):
        assert os.readlink(f"/proc/{pid}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}")
    marker = f"/dev/shm/lightning-grpo-visible-{uuid.uuid4().hex}"
    with open(marker, "w") as f:
        f.write("trainer")
    try:
        assert os.path.exists(marker) and not os.path.exists(f"/proc/{pid}/root{marker}")
    finally:
        os.unlink(marker)


@pytest.mark.parametrize("weight_sync", [True, False])
def test_tcp_push_keeps_the_isolated_server_equal_to_the_trainer(
    isolated_server, tiny_model_path, tmp_path, weight_sync
):
    url = isolated_server.url
    rollout = _server_callback(url, transfer="tcp", weight_sync=weight_sync)
    probe = PushProbe(rollout, url)
    _fit([rollout, probe], tiny_model_path, steps=3, root=tmp_path)
    print(f"tcp, weight_sync={weight_sync}: max |server - trainer| log-prob after each push {probe.gaps}")
    assert len(probe.gaps) == 3
    if weight_sync:
        assert max(probe.gaps) < 1e-5, probe.gaps
    else:  # the server keeps the step-0 weights
        assert min(probe.gaps) > 1e-5 and probe.gaps[-1] > 0.1, probe.gaps


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs the trainer and the server on different GPUs")
@pytest.mark.parametrize("weight_sync", [True, False])
def test_nccl_push_keeps_a_gpu_server_equal_to_the_trainer(tiny_model_path, tmp_path, weight_sync):
    from lightning_grpo.rollout.server_client import ServerClient
    from lightning_grpo.rollout.server_process import ServerProcess, free_port

    server = ServerProcess(
        str(tiny_model_path),
        free_port(),
        tmp_path / "server",
        transfer_backend="nccl",
        kv_cache_bytes=256 * 1024**2,
        extra_args=["--gpu-memory-utilization", "0.3"],
        env={"CUDA_VISIBLE_DEVICES": "1"},
    ).start()
    try:
        server.wait_healthy(300, ServerClient(server.url).healthy)
        rollout = _server_callback(server.url, transfer="nccl", weight_sync=weight_sync)
        probe = PushProbe(rollout, server.url)
        _fit([rollout, probe], tiny_model_path, steps=3, root=tmp_path)  # the policy on CPU, the push from cuda:0
    finally:
        server.stop()
    print(f"nccl, weight_sync={weight_sync}: max |server - trainer| log-prob after each push {probe.gaps}")
    if weight_sync:
        assert max(probe.gaps) < 1e-4, probe.gaps
    else:
        assert min(probe.gaps) > 1e-5 and probe.gaps[-1] > 0.1, probe.gaps


def test_a_tcp_push_that_skips_a_layer_is_caught(isolated_server, tiny_model_path):
    """The push check over TCP: a push whose buckets leave out one layer's weight (a layer skipped) stops
    with the server named and "part of the weights"; the healthy push before it passes."""
    from lightning_grpo.callbacks.push_check import WeightPushError
    from lightning_grpo.models.weights import policy_weights_for_engine
    from lightning_grpo.rollout.server_client import ServerClient
    from lightning_grpo.rollout.server_engine import ServerEngine
    from lightning_grpo.rollout.tcp_transfer import TcpTransport
    from tests.callbacks.test_push_check import _module, _policy, pushed_and_checked_once

    url = isolated_server.url
    policy = _policy(tiny_model_path)
    module = _module(policy)
    engine = ServerEngine([ServerClient(url)], transport=TcpTransport())
    try:
        check = pushed_and_checked_once(engine, policy, module)
        skipped = "model.layers.0.mlp.down_proj.weight"
        engine.load_weights(((n, t) for n, t in policy_weights_for_engine(policy) if n != skipped), version=2)
        with pytest.raises(WeightPushError, match=rf"ServerEngine \({url}\) at step 2 .*part of the weights"):
            check.after_push(engine, module, 2)
    finally:
        engine.close()
