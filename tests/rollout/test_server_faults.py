"""Faults of ``engine: vllm_server``: a server that never becomes healthy, a port already in use, a
wrong model path, a server killed mid-run (error naming its URL after a checkpoint), a server that
does not answer while another does (its requests go to the other)."""

from __future__ import annotations

import json
import os
import signal
import socket

import lightning as L
import pytest
import torch

from lightning_grpo.rollout.server_client import ServerClient
from lightning_grpo.rollout.server_engine import NoServerLeftError, ServerEngine
from lightning_grpo.rollout.server_process import ServerProcess, ServerStartError, free_port, start_servers
from tests.e2e.test_server_training import _fit, _server_callback

pytestmark = pytest.mark.vllm


def test_server_that_never_becomes_healthy_names_url_and_log(tiny_model_path, tmp_path):
    pytest.importorskip("vllm")
    with pytest.raises(ServerStartError) as err:
        start_servers(str(tiny_model_path), 1, tmp_path, timeout=1.0, is_healthy=lambda url: False)
    message = str(err.value)
    assert "did not become healthy within 1 s" in message and "http://127.0.0.1:" in message
    log = next(tmp_path.glob("vllm-server-*.log"))
    assert str(log) in message


def test_port_already_in_use(tiny_model_path, tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        with pytest.raises(ServerStartError, match=f"http://127.0.0.1:{port}: port {port} is already in use"):
            ServerProcess(str(tiny_model_path), port, tmp_path).start()


def test_wrong_model_path(tmp_path):
    with pytest.raises(ServerStartError, match="model path .*missing.* is not a directory with a config.json"):
        ServerProcess(str(tmp_path / "missing"), free_port(), tmp_path).start()
    pytest.importorskip("vllm")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"model_type": "no_such_architecture"}))
    server = ServerProcess(str(broken), free_port(), tmp_path / "logs").start()
    with pytest.raises(
        ServerStartError, match="exited with code .* before becoming healthy; see its log .*vllm-server-"
    ):
        server.wait_healthy(120, ServerClient(server.url).healthy)


class KillServer(L.Callback):
    """Kills the server's process group (as a crash would) after the given training step."""

    def __init__(self, server: ServerProcess, after_step: int) -> None:
        self.server, self.after_step = server, after_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.after_step and self.server.alive():
            os.killpg(self.server.process.pid, signal.SIGKILL)
            self.server.process.wait(30)


def test_server_killed_mid_run_stops_with_its_url_after_a_checkpoint(tiny_model_path, tmp_path):
    pytest.importorskip("vllm")
    server = ServerProcess(str(tiny_model_path), free_port(), tmp_path / "logs").start()
    try:
        server.wait_healthy(300, ServerClient(server.url).healthy)
        rollout = _server_callback(server.url)
        with pytest.raises(NoServerLeftError) as err:
            _fit([rollout, KillServer(server, after_step=2)], tiny_model_path, steps=5, root=tmp_path)
    finally:
        server.stop()
    message = str(err.value)
    assert f"no vLLM server left ({server.url}:" in message and "training stopped at step 2" in message
    path = message.split("checkpoint written to ")[-1]
    assert os.path.isfile(path)
    assert torch.load(path, weights_only=False)["global_step"] == 2


def test_requests_of_a_server_that_does_not_answer_go_to_the_others(vllm_server, tiny_model_path, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there: connections are refused
    engine = ServerEngine([ServerClient(dead), ServerClient(vllm_server)])
    rollout = _server_callback(vllm_server)
    rollout.use_engine(engine)
    _fit([rollout], tiny_model_path, steps=2, root=tmp_path)
    assert list(engine.dead) == [dead] and "Connection refused" in engine.dead[dead]
    assert engine.version == 1  # the live server took every push and every request
