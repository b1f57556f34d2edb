"""vLLM general plugin: registers the ``lightning_grpo_shm`` weight transfer backend.

vLLM loads every entry point of the group ``vllm.general_plugins`` in each of its processes (API
server, engine core, workers). This package declares one in ``pyproject.toml``
(``lightning_grpo = "lightning_grpo.vllm_plugin:register"``), so a server started with

    vllm serve MODEL --weight-transfer-config '{"backend": "lightning_grpo_shm"}'

in an environment where lightning-grpo is installed accepts weights through vLLM's RL endpoints
(``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``) from a trainer on the
same machine: :mod:`lightning_grpo.rollout.shm_transfer` writes the buckets, the engine below
maps them and loads the tensors with vLLM's layerwise reload (the same path as vLLM's CUDA-IPC
backend, which re-runs each layer's post-load processing, e.g. the CPU GEMM repacking).
"""

from __future__ import annotations

from dataclasses import dataclass, field

BACKEND = "lightning_grpo_shm"


def register() -> None:
    """Register the backend with vLLM's ``WeightTransferEngineFactory`` (safe to call repeatedly:
    vLLM loads plugins once per process, but an environment may list the entry point twice)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, "lightning_grpo.vllm_plugin", "ShmWeightTransferEngine")


try:  # the engine class needs vLLM; importing this module without it only exposes register()
    from vllm.distributed.weight_transfer.base import (
        WeightTransferEngine,
        WeightTransferInitInfo,
        WeightTransferUpdateInfo,
    )
except ImportError:  # pragma: no cover - exercised only without vLLM
    WeightTransferEngine = None

if WeightTransferEngine is not None:

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

    class ShmWeightTransferEngine(WeightTransferEngine[ShmInitInfo, ShmUpdateInfo]):
        """Server side of ``lightning_grpo_shm``: load HF-named tensors from a shared-memory bucket."""

        init_info_cls = ShmInitInfo
        update_info_cls = ShmUpdateInfo

        def init_transfer_engine(self, init_info: ShmInitInfo) -> None:
            pass

        def start_weight_update(self) -> None:
            from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

            initialize_layerwise_reload(self.model)

        def finish_weight_update(self) -> None:
            from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

            finalize_layerwise_reload(self.model, self.model_config)

        def update_weights(self, update_info: dict) -> None:
            self.receive_weights(self.parse_update_info(update_info))  # CPU: nothing to synchronise

        def receive_weights(self, update_info: ShmUpdateInfo) -> None:
            from lightning_grpo.rollout.shm_transfer import read_bucket

            info = update_info
            self.model.load_weights(list(read_bucket(info.path, info.names, info.dtype, info.shapes, info.offsets)))

        def shutdown(self) -> None:
            pass
