"""The weight transports of ServerEngine without a vLLM server: the TCP protocol against an in-test
worker, and the NCCL wiring against a stand-in for vLLM's trainer engine (NCCL itself needs GPUs)."""

from __future__ import annotations

import socket
import threading

import pytest
import torch

from lightning_grpo.rollout.shm_transfer import bucket_tensors
from lightning_grpo.rollout.tcp_transfer import TcpTransport, connect_to_trainer, receive_bucket
from lightning_grpo.rollout.vllm_server import ServerSettings, WeightTransfer


class TcpWorkerClient:
    """Stands in for a ServerClient whose server has ``world`` workers using lightning_grpo_tcp: each
    worker connects on /init_weight_transfer_engine and reads its bytes on /update_weights (one
    thread per worker, as vLLM's collective_rpc runs them)."""

    url = "http://127.0.0.1:1"

    def __init__(self, world: int = 2) -> None:
        self.world, self.sockets, self.calls = world, [], []
        self.received: list[dict[str, torch.Tensor]] = [{} for _ in range(world)]
        self.transfer_ready = False

    def world_size(self) -> int:
        return self.world

    def init_transfer(self, info: dict) -> None:
        self.calls.append("init")
        self.sockets = [
            connect_to_trainer(info["host"], info["port"], info["token"], r, self.world, 5.0) for r in range(self.world)
        ]

    def update_weights(self, info: dict) -> None:
        self.calls.append(f"update {info['update_id']}")

        def read(rank: int) -> None:
            buffer = receive_bucket(self.sockets[rank], info["update_id"], info["nbytes"])
            for name, t in bucket_tensors(buffer, info["names"], info["dtype"], info["shapes"], info["offsets"]):
                self.received[rank][name] = t.clone()

        threads = [threading.Thread(target=read, args=(r,)) for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def push(self, infos, version, load_bucket):
        self.calls.append("pause")
        for i, info in enumerate(infos):
            load_bucket(i, info)
        self.calls += [f"finish {version}", "resume"]


def _weights() -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    return [(f"layer.{i}.weight", torch.randn(64 + i, 48, generator=gen)) for i in range(6)] + [
        ("norm.weight", torch.ones(7))
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tcp_push_delivers_every_tensor_to_every_worker(dtype):
    weights = _weights()
    transport = TcpTransport("127.0.0.1", 0, timeout=10.0)
    client = TcpWorkerClient(world=2)
    try:
        for version in (0, 1):  # the second push reuses the connections
            buckets = transport.prepare(weights, dtype, bucket_bytes=10_000)  # several buckets
            assert len(buckets.layouts) > 2
            transport.push(client, buckets, version)
            transport.release(buckets)
    finally:
        transport.close()
    for got in client.received:
        assert list(got) == [name for name, _ in weights]
        for name, tensor in weights:
            assert got[name].dtype == dtype and torch.equal(got[name], tensor.to(dtype))
    n = len(buckets.layouts)
    assert client.calls[0] == "init" and client.calls.count("init") == 1
    assert [c for c in client.calls if c.startswith("update")] == [f"update {i}" for i in range(2 * n)]
    assert client.calls[-2:] == ["finish 1", "resume"]


def test_tcp_stream_out_of_step_is_detected():
    listener = socket.create_server(("127.0.0.1", 0))
    worker = connect_to_trainer("127.0.0.1", listener.getsockname()[1], "00" * 16, 0, 1, 5.0)
    trainer, _ = listener.accept()
    from lightning_grpo.rollout.tcp_transfer import HEADER, MAGIC

    trainer.sendall(HEADER.pack(MAGIC, 7, 128))
    with pytest.raises(
        ConnectionError, match=r"out of step: expected bucket 3 \(128 bytes\), the trainer sent 7 \(128 bytes\)"
    ):
        receive_bucket(worker, 3, 128)
    for s in (worker, trainer, listener):
        s.close()


def test_tcp_connect_reports_missing_workers():
    class Silent(TcpWorkerClient):
        def init_transfer(self, info):  # a server that cannot reach the trainer's address
            pass

    transport = TcpTransport("127.0.0.1", 0, timeout=0.5)
    try:
        with pytest.raises(
            ConnectionError,
            match=r"0 of 2 workers connected to 127.0.0.1:\d+ within 0 s \(can the server reach this address\? rollout.engine.init_args.transfer.host\)",
        ):
            transport.push(Silent(world=2), transport.prepare(_weights(), torch.float32, 1 << 20), 0)
    finally:
        transport.close()


@pytest.mark.parametrize(
    "args, message",
    [
        ({"backend": "rdma"}, r"rollout.engine.init_args.transfer.backend must be one of shm, tcp, nccl, got 'rdma'"),
        (
            {"backend": "tcp", "port": 70000},
            r"rollout.engine.init_args.transfer.port must be a TCP port \(0 = any free one\), got 70000",
        ),
    ],
)
def test_bad_transfer_settings(args, message):
    with pytest.raises(ValueError, match=message):
        ServerSettings(urls=["http://10.0.0.2:8000"], transfer=WeightTransfer(**args))


# ------------------------------------------------------------------------------------- NCCL
class FakeServer:
    """Records the control-plane calls the NCCL transport makes through a ServerClient."""

    url = "http://10.0.0.2:8000"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def world_size(self) -> int:
        return 4

    def init_transfer(self, info) -> None:
        self.calls.append(f"init {sorted(info)}")

    def start_update(self) -> None:
        self.calls.append("start")

    def update_weights(self, info) -> None:
        self.calls.append(f"update {info['names']}")

    def finish_update(self, version) -> None:
        self.calls.append(f"finish {version}")

    def paused(self):
        import contextlib

        @contextlib.contextmanager
        def ctx():
            self.calls.append("pause")
            yield
            self.calls.append("resume")

        return ctx()


@pytest.mark.vllm
def test_nccl_transport_drives_vllms_trainer_engine(monkeypatch):
    """One NCCL group per server: trainer rank 0 + the server's 4 workers, rendezvous at
    transfer.host:transfer.port; each push pauses, sends every tensor through vLLM's engine (start,
    update, finish tagged with the version) and resumes."""
    from vllm.distributed.weight_transfer import factory

    from lightning_grpo.rollout.nccl_transfer import NcclTransport

    made = []

    class FakeEngine:  # what NCCLTrainerWeightTransferEngine.send_weights does over its client
        def __init__(self, info, client):
            self.info, self.client, self.source = info, client, None

        def send_weights(self):
            self.client.start_weight_update()
            self.client.update_weights({"names": [m.name for m in self.source.metadata()]})
            assert [n for n, _ in self.source] == [m.name for m in self.source.metadata()]
            self.client.finish_weight_update()

        def shutdown(self):
            made.append("shutdown")

    def trainer_init(info, *, client, source):
        client.init_weight_transfer_engine({"master_address": info.master_address, "master_port": info.master_port})
        made.append(FakeEngine(info, client))
        return made[-1]

    monkeypatch.setattr(factory.WeightTransferTrainerFactory, "trainer_init", trainer_init)
    transport, server = NcclTransport("10.0.0.1", 29600), FakeServer()
    pairs = [("a.weight", torch.zeros(2, 2)), ("b.weight", torch.ones(3))]
    transport.push(server, pairs, version=5)
    transport.push(server, pairs, version=6)
    transport.close()
    info = made[0].info
    assert (info.master_address, info.master_port, info.world_size, info.rank) == ("10.0.0.1", 29600, 5, 0)

    def push(v):
        return ["pause", "start", "update ['a.weight', 'b.weight']", f"finish {v}", "resume"]

    assert server.calls == ["init ['master_address', 'master_port']", *push(5), *push(6)]
    assert made[1:] == ["shutdown"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_nccl_needs_cuda_in_the_trainer():
    from lightning_grpo.rollout.nccl_transfer import NcclTransport

    with pytest.raises(
        RuntimeError,
        match=r"rollout.engine.init_args.transfer.backend: nccl needs a CUDA device in the trainer; use backend: tcp",
    ):
        NcclTransport().prepare([("w", torch.zeros(2))], torch.bfloat16, 1 << 20)
