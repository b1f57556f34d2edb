"""Trainer side of vLLM's own ``nccl`` weight transfer, for GPU servers on any machine.

A GPU server started with ``--weight-transfer-config '{"backend": "nccl"}'`` receives weights by
NCCL broadcast straight into its GPUs. vLLM ships both halves: the server's
``NCCLWeightTransferEngine`` and the trainer's ``NCCLTrainerWeightTransferEngine``, built by
``WeightTransferTrainerFactory.trainer_init`` and driven through any client with vLLM's four
weight-sync calls. :class:`NcclTransport` wires them into
:class:`~lightning_grpo.rollout.server_engine.ServerEngine`: per server, one NCCL group of the
trainer (rank 0, at ``transfer.host:transfer.port``, which the server's workers must reach) and the
server's workers (``GET /get_world_size`` of them); each push pauses the server, broadcasts every
tensor (packed into vLLM's double-buffered chunks), tags the version, drops the prefix cache and
resumes.

Needs CUDA on the trainer and the ``vllm`` (GPU) package; not run on this project's CPU machine
(the wiring is tested with a stand-in for vLLM's engine, tests/e2e/test_server_transfers.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from lightning_grpo.rollout.engine_settings import ENGINE_ARGS

from .tcp_transfer import local_address_towards

BACKEND = "nccl"


class NcclTransport:
    """Pushes through vLLM's NCCL trainer engine, one NCCL group per server.

    Args:
        host: address the servers' workers reach this trainer at (NCCL rendezvous); None = the
            address on the route to the server.
        port: rendezvous port of the first server (the i-th server gets ``port + i``); 0 = free ports.
        packed: vLLM's packed broadcast (chunks of ``packed_buffer_size_bytes``, double-buffered).
    """

    backend = BACKEND

    def __init__(self, host: str | None = None, port: int = 0, packed: bool = True) -> None:
        self.host, self.port, self.packed = host, port, packed
        self._engines: dict[str, Any] = {}
        self._clients: dict[str, _SyncClient] = {}

    def prepare(self, weights: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype, bucket_bytes: int) -> list:
        """A snapshot of ``(name, tensor)`` on this process's GPU in the servers' dtype (one copy of the
        weights: the pipeline may train on while it is sent)."""
        if not torch.cuda.is_available():
            raise RuntimeError(
                f"{ENGINE_ARGS}.transfer.backend: nccl needs a CUDA device in the trainer; use backend: tcp for CPU"
            )
        device = torch.device("cuda", torch.cuda.current_device())
        out = []
        for name, tensor in weights:
            moved = tensor.detach().to(device=device, dtype=dtype)
            out.append((name, moved.clone() if moved.data_ptr() == tensor.data_ptr() else moved))
        return out

    def push(self, client: Any, pairs: list, version: int) -> None:
        engine = self._engines.get(client.url) or self._connect(client, len(self._engines))
        engine.source = list_source(pairs)
        self._clients[client.url].version = version
        with client.paused():
            engine.send_weights()  # start_weight_update, update_weights || broadcast, finish_weight_update

    def _connect(self, client: Any, index: int) -> Any:
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        from .server_process import free_port

        host = self.host or local_address_towards(client.url)
        port = self.port + index if self.port else free_port(host)
        info = NCCLTrainerInitInfo(
            master_address=host, master_port=port, world_size=1 + client.world_size(), packed=self.packed, rank=0
        )
        sync = self._clients[client.url] = _SyncClient(client)
        engine = WeightTransferTrainerFactory.trainer_init(info, client=sync, source=list_source([]))
        self._engines[client.url] = engine
        return engine

    def release(self, pairs: list) -> None:
        pairs.clear()

    def close(self) -> None:
        for engine in self._engines.values():
            engine.shutdown()
        self._engines.clear()


class _SyncClient:
    """vLLM's ``VLLMWeightSyncClient`` protocol over a :class:`~lightning_grpo.rollout.server_client.ServerClient`;
    ``finish_weight_update`` tags the push's version and drops the server's prefix cache."""

    def __init__(self, client: Any) -> None:
        self.client, self.version = client, -1

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.client.init_transfer(init_info)

    def start_weight_update(self) -> None:
        self.client.start_update()

    def update_weights(self, update_info: Any) -> None:
        self.client.update_weights(update_info)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.client.finish_update(self.version)


def list_source(pairs: list) -> Any:
    """vLLM's ``WeightSource`` over a list of ``(name, tensor)`` pairs."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class _ListSource(WeightSource):
        def metadata(self) -> list:
            return [ParamMeta(name, t.dtype, tuple(t.shape)) for name, t in pairs]

        def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
            return iter(pairs)

    return _ListSource()
