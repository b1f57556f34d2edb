"""vLLM general plugin: registers the ``lightning_grpo_shm`` and ``lightning_grpo_tcp`` weight transfer backends.

vLLM loads every entry point of the group ``vllm.general_plugins`` in each of its processes (API
server, engine core, workers). This package declares one (:mod:`lightning_grpo.vllm_entry`), which
calls :func:`register` only where ``LIGHTNING_GRPO_VLLM_PLUGIN=1``, so a server started with

    LIGHTNING_GRPO_VLLM_PLUGIN=1 vllm serve MODEL --weight-transfer-config '{"backend": "lightning_grpo_shm"}'

in an environment where lightning-grpo is installed accepts weights through vLLM's RL endpoints
(``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``) from a trainer on the
same machine: :mod:`lightning_grpo.rollout.shm_transfer` writes the buckets, the engine below
maps them and loads the tensors with vLLM's layerwise reload (the same path as vLLM's CUDA-IPC
backend, which re-runs each layer's post-load processing, e.g. the CPU GEMM repacking).
``{"backend": "lightning_grpo_tcp"}`` takes the same buckets over a TCP connection from a trainer on
any machine the server can reach (:mod:`lightning_grpo.rollout.tcp_transfer`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

BACKEND = "lightning_grpo_shm"
TCP_BACKEND = "lightning_grpo_tcp"
_ENGINES = {BACKEND: "ShmWeightTransferEngine", TCP_BACKEND: "TcpWeightTransferEngine"}


def register() -> None:
    """Register the backends with vLLM's ``WeightTransferEngineFactory`` (safe to call repeatedly:
    vLLM loads plugins once per process, but an environment may list the entry point twice)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    for name, cls in _ENGINES.items():
        if name not in WeightTransferEngineFactory._registry:
            WeightTransferEngineFactory.register_engine(name, "lightning_grpo.rollout.vllm_plugin", cls)


try:  # the engine class needs vLLM; importing this module without it only exposes register()
    from vllm.distributed.weight_transfer.base import (
        WeightTransferEngine,
        WeightTransferInitInfo,
        WeightTransferUpdateInfo,
    )
except ImportError:  # pragma: no cover - exercised only without vLLM
    WeightTransferEngine = None

if WeightTransferEngine is not None:

    class _LayerwiseReload:
        """Checkpoint-format loading: vLLM's layerwise reload around the buckets of one update."""

        def start_weight_update(self) -> None:
            from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

            initialize_layerwise_reload(self.model)

        def finish_weight_update(self) -> None:
            from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

            finalize_layerwise_reload(self.model, self.model_config)

    @dataclass
    class ShmInitInfo(WeightTransferInitInfo):
        """Nothing to rendezvous: buckets are files named in each update."""

    @dataclass
    class ShmUpdateInfo(WeightTransferUpdateInfo):
        """One bucket: a file holding ``names`` at byte ``offsets``, all of ``dtype``."""

        path: str
        names: list[str]
        dtype: str
        shapes: list[list[int]]
        offsets: list[int] = field(default_factory=list)

    class ShmWeightTransferEngine(_LayerwiseReload, WeightTransferEngine[ShmInitInfo, ShmUpdateInfo]):
        """Server side of ``lightning_grpo_shm``: load HF-named tensors from a shared-memory bucket."""

        init_info_cls = ShmInitInfo
        update_info_cls = ShmUpdateInfo

        def init_transfer_engine(self, init_info: ShmInitInfo) -> None:
            pass

        def update_weights(self, update_info: dict) -> None:
            self.receive_weights(self.parse_update_info(update_info))  # CPU: nothing to synchronise

        def receive_weights(self, update_info: ShmUpdateInfo) -> None:
            from lightning_grpo.rollout.shm_transfer import read_bucket

            info = update_info
            self.model.load_weights(list(read_bucket(info.path, info.names, info.dtype, info.shapes, info.offsets)))

        def shutdown(self) -> None:
            pass

    @dataclass
    class TcpInitInfo(WeightTransferInitInfo):
        """Where the trainer listens, and the token this server's workers present."""

        host: str
        port: int
        token: str
        timeout: float = 600.0

    @dataclass
    class TcpUpdateInfo(WeightTransferUpdateInfo):
        """One bucket: ``nbytes`` bytes on the socket after a header carrying ``update_id``."""

        names: list[str]
        dtype: str
        shapes: list[list[int]]
        offsets: list[int]
        nbytes: int
        update_id: int

    class TcpWeightTransferEngine(_LayerwiseReload, WeightTransferEngine[TcpInitInfo, TcpUpdateInfo]):
        """Server side of ``lightning_grpo_tcp``: each worker connects to the trainer once and reads
        every bucket's bytes from that connection (no shared memory, any machine)."""

        init_info_cls = TcpInitInfo
        update_info_cls = TcpUpdateInfo
        _socket = None

        def init_transfer_engine(self, init_info: TcpInitInfo) -> None:
            from vllm.distributed import get_world_group

            from lightning_grpo.rollout.tcp_transfer import connect_to_trainer

            self.shutdown()
            group = get_world_group()
            info = init_info
            self._socket = connect_to_trainer(
                info.host, info.port, info.token, group.rank_in_group, group.world_size, info.timeout
            )

        def update_weights(self, update_info: dict) -> None:
            self.receive_weights(self.parse_update_info(update_info))  # loaded synchronously

        def receive_weights(self, update_info: TcpUpdateInfo) -> None:
            from lightning_grpo.rollout.shm_transfer import bucket_tensors
            from lightning_grpo.rollout.tcp_transfer import receive_bucket

            if self._socket is None:
                raise RuntimeError("lightning_grpo_tcp: /update_weights before /init_weight_transfer_engine")
            info = update_info
            buffer = receive_bucket(self._socket, info.update_id, info.nbytes)  # [nbytes] uint8
            self.model.load_weights(list(bucket_tensors(buffer, info.names, info.dtype, info.shapes, info.offsets)))

        def shutdown(self) -> None:
            if self._socket is not None:
                self._socket.close()
                self._socket = None
