"""``rollout.engine: vllm_server``: connect to vLLM servers the user runs, or start them as child processes.

Settings come from `ServerSettings` (``rollout.engine``'s ``init_args``). With ``urls`` the
servers are the user's (started as in docs/guide/scaling.md); otherwise ``launch.num_servers`` servers
are started here on free ports with the policy's model directory, their logs in the run
directory, and stopped when the engine closes.

Under DDP: with ``urls`` every rank samples on the same servers and rank 0 alone pushes weights
(the other ranks wait until every server reports the new version before they sample again);
with started servers each rank starts and updates its own.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal

from .engine_settings import ENGINE_ARGS, EngineContext, EngineSettings, register_engine
from .server_client import ServerClient, version_number
from .server_engine import ServerEngine
from .shm_transfer import BUCKET_BYTES, ShmTransport

#: ``transfer.backend`` -> the servers' ``--weight-transfer-config`` backend.
TRANSFER_BACKENDS = {"shm": "lightning_grpo_shm", "tcp": "lightning_grpo_tcp", "nccl": "nccl"}


@dataclass(frozen=True)
class ServerLaunch:
    """The vLLM servers started here when ``urls`` is None (each a ``vllm serve`` child process):
    ``rollout.engine.init_args.launch: {num_servers: 2, cpus: [0]}``."""

    num_servers: int = 1
    """Servers to start (each takes ``kv_cache_memory_bytes`` plus a model copy)."""
    args: list[str] = field(default_factory=list)
    """More ``vllm serve`` options (e.g. ``["--tensor-parallel-size", "2"]``)."""
    cpus: list[int] | None = None
    """CPU cores the servers are pinned to (e.g. ``[0]``, leaving the others to the trainer); None = any."""
    start_timeout: float = 300.0
    """Seconds to wait for a started server's ``/health``."""
    log_dir: str | None = None
    """Where the servers write ``vllm-server-<port>.log``; None = the run's log directory."""

    def __post_init__(self) -> None:
        if self.num_servers < 1:
            raise ValueError(f"{ENGINE_ARGS}.launch.num_servers must be >= 1, got {self.num_servers}")
        if self.start_timeout <= 0:
            raise ValueError(f"{ENGINE_ARGS}.launch.start_timeout must be > 0 seconds, got {self.start_timeout}")


@dataclass(frozen=True)
class WeightTransfer:
    """How pushed weights reach the servers: ``rollout.engine.init_args.transfer: {backend: tcp, port: 29600}``."""

    backend: Literal["shm", "tcp", "nccl"] = "shm"
    """It must match the servers' ``--weight-transfer-config`` backend (started servers get the right one).
    "shm": shared memory, servers on the trainer's machine (``lightning_grpo_shm``); "tcp": a TCP connection
    from each server to the trainer, any machine, CPU or GPU (``lightning_grpo_tcp``); "nccl": vLLM's NCCL
    broadcast, GPU trainer and GPU servers on any machine (``nccl``). docs/guide/scaling.md."""
    host: str | None = None
    """This machine's address as the servers reach it, for "tcp" / "nccl" (they connect to the trainer);
    None = the address on the route to the first server (loopback for local servers)."""
    port: int = 0
    """Port the trainer listens on for "tcp" / "nccl" (open it in the firewall); 0 = a free port."""
    bucket_bytes: int = BUCKET_BYTES
    """Bytes per weight-push bucket (one ``/update_weights`` call each)."""

    def __post_init__(self) -> None:
        if self.backend not in TRANSFER_BACKENDS:
            raise ValueError(
                f"{ENGINE_ARGS}.transfer.backend must be one of {', '.join(TRANSFER_BACKENDS)}, got {self.backend!r}"
            )
        if not 0 <= int(self.port) < 65536:
            raise ValueError(f"{ENGINE_ARGS}.transfer.port must be a TCP port (0 = any free one), got {self.port}")


@register_engine
@dataclass
class ServerSettings(EngineSettings):
    """vLLM servers (`ServerEngine`), ``rollout.engine: vllm_server``.

    ``rollout.engine: {class_path: lightning_grpo.ServerSettings, init_args: {...}}`` sets its fields.

    Weights are pushed through vLLM's RL API after every optimizer step; the servers can sample ahead while
    the trainer trains (``rollout.max_staleness``). Started servers' fields left at None follow the device and
    the model as `VLLMArgs`' do (`lightning_grpo.rollout.engine_defaults`)."""

    name: ClassVar[str] = "vllm_server"
    async_capable: ClassVar[bool] = True

    urls: list[str] | None = None
    """Servers you run (``http://host:port``); None = start ``launch.num_servers`` here."""
    launch: ServerLaunch = field(default_factory=ServerLaunch)
    """The servers started here when ``urls`` is None (`ServerLaunch`: ``num_servers``, ``args``, ``cpus``,
    ``start_timeout``, ``log_dir``)."""
    transfer: WeightTransfer = field(default_factory=WeightTransfer)
    """How pushed weights reach the servers (`WeightTransfer`: ``backend``, ``host``, ``port``,
    ``bucket_bytes``)."""
    dtype: Literal["float32", "float16", "bfloat16"] | None = None
    """The servers' dtype (pushed weights are cast to it). None = float32 on CPU; on a GPU bfloat16 where
    supported, else float16."""
    max_model_len: int | None = None
    """Longest prompt + completion in tokens. None = the longest prompt of the data (train, val and test
    records) + ``rollout.sampling.max_new_tokens``; a value set smaller than that is refused."""
    kv_cache_memory_bytes: int | None = None
    """KV cache of a started server in bytes. None = on CPU room for one generation's sequences at
    ``max_model_len``, 64 MiB at least (`lightning_grpo.rollout.engine_defaults`); on a GPU vLLM sizes
    it from its memory share."""
    max_num_batched_tokens: int | None = None
    """Tokens one scheduler step of a started server may prefill. On CPU chunked prefill is off
    (a split seeded prefill crashes vLLM-CPU: `prefill`), so it must be
    at least ``max_model_len``; None = ``max(max_model_len, 4096)`` on CPU, vLLM's default on GPU."""
    request_timeout: float = 600.0
    """Seconds before an unanswered request marks a server dead."""

    def __post_init__(self) -> None:
        if self.urls is not None and (not isinstance(self.urls, list) or not self.urls):
            raise ValueError(f"{ENGINE_ARGS}.urls must be a non-empty list of server URLs or null, got {self.urls!r}")
        for url in self.urls or []:
            if not str(url).startswith(("http://", "https://")):
                raise ValueError(f"{ENGINE_ARGS}.urls: {url!r} is not an http:// or https:// URL")
        if self.max_model_len is not None and (not isinstance(self.max_model_len, int) or self.max_model_len < 1):
            raise ValueError(f"{ENGINE_ARGS}.max_model_len must be an integer >= 1 or null, got {self.max_model_len!r}")

    def context_limit(self) -> tuple[int | None, str]:
        return self.max_model_len, f"{ENGINE_ARGS}.max_model_len"

    def check(self, *, weight_sync_enabled: bool, max_model_len: int | None) -> None:
        """Servers started here on CPU: their prefill settings hold ``max_model_len`` (set, else the derived one)."""
        length = self.max_model_len if self.max_model_len is not None else max_model_len
        if self.urls is not None or length is None:
            return
        from .prefill import cpu_server_args, is_cpu_platform

        if is_cpu_platform():
            cpu_server_args(length, self.max_num_batched_tokens, list(self.launch.args))

    def server_urls(self) -> list[str]:
        return list(self.urls or [])

    def for_device(self, cpu: bool, config: dict[str, Any], sequences: int) -> ServerSettings:
        """A copy with the fields left at None decided for the device and the model (``config``: its
        ``config.json``, for servers started here; `lightning_grpo.rollout.engine_defaults`)."""
        from .engine_defaults import cpu_kv_cache_bytes, default_dtype

        dtype = self.dtype or default_dtype(cpu)
        kv = self.kv_cache_memory_bytes
        if kv is None and cpu and self.urls is None and self.max_model_len is not None:
            kv = cpu_kv_cache_bytes(config, dtype, self.max_model_len, sequences)
        return replace(self, dtype=dtype, kv_cache_memory_bytes=kv)

    def build(
        self,
        module: Any,
        tokenizer: Any,
        seed: int,
        context: EngineContext,
        *,
        max_model_len: int | None,
        sequences: int,
    ) -> ServerEngine:
        """Connect to ``urls``, or start servers on the model directory (a temporary copy of an in-memory policy is
        removed when the engine is closed or fails to start)."""
        import shutil
        import tempfile

        from .model_dir import engine_model_dir

        settings = self if self.max_model_len is not None else replace(self, max_model_len=max_model_len)
        log_dir = context.log_dir or tempfile.mkdtemp(prefix="lightning-grpo-servers-")
        model_dir, temporary = engine_model_dir(module, tokenizer) if self.urls is None else (None, False)
        try:
            return build_server_engine(
                settings, model_dir, context.rank, log_dir, context.broadcast, temporary, sequences=sequences
            )
        except BaseException:
            if temporary:
                shutil.rmtree(str(model_dir), ignore_errors=True)
            raise


def build_transport(settings: ServerSettings) -> Any:
    """The trainer side of ``settings.transfer``."""
    transfer = settings.transfer
    if transfer.backend == "tcp":
        from .tcp_transfer import TcpTransport

        return TcpTransport(transfer.host, transfer.port, settings.request_timeout)
    if transfer.backend == "nccl":
        from .nccl_transfer import NcclTransport

        return NcclTransport(transfer.host, transfer.port)
    return ShmTransport()


def build_server_engine(
    settings: ServerSettings,
    model_dir: str | None,
    rank: int,
    default_log_dir: str,
    broadcast: Callable[[Any], Any] = lambda obj: obj,
    owns_model_dir: bool = False,
    sequences: int = 1,
) -> ServerEngine:
    """Connect to ``settings.urls`` or start servers on ``model_dir``; rank 0 pushes to shared servers.
    ``broadcast``: rank 0's value on every rank (the strategy's; every rank calls this together);
    ``owns_model_dir``: ``model_dir`` is a copy made for the servers, removed when the engine is closed;
    ``sequences``: how many one generation samples at once (sizes a CPU KV cache left unset)."""
    from .engine_defaults import model_config
    from .prefill import is_cpu_platform

    settings = settings.for_device(is_cpu_platform(), model_config(model_dir) if model_dir else {}, sequences)
    common = dict(
        dtype=settings.dtype,
        max_model_len=settings.max_model_len,
        bucket_bytes=settings.transfer.bucket_bytes,
        transport=build_transport(settings),
    )
    if settings.urls is not None:
        clients = [ServerClient(url, settings.request_timeout) for url in settings.urls]
        for client in clients:
            if not client.healthy():
                raise ConnectionError(f"vLLM server {client.url} ({ENGINE_ARGS}.urls) does not answer GET /health")
        # servers an earlier run pushed to report its last version: number this run's pushes above it,
        # read by rank 0 before it pushes anything and shared, so every rank waits for the same tags
        base = broadcast(_next_version(clients) if rank == 0 else None)
        return ServerEngine(clients, pusher=rank == 0, version_base=base, **common)
    from .server_process import start_servers

    if settings.max_model_len is None:
        raise ValueError(
            f"{ENGINE_ARGS}.max_model_len is not set: servers started here need it (RolloutCallback derives it)"
        )
    settings.check(weight_sync_enabled=True, max_model_len=None)
    launch = settings.launch
    log_dir = launch.log_dir or os.path.join(default_log_dir, f"vllm-servers-rank{rank}")
    processes = start_servers(
        str(model_dir),
        launch.num_servers,
        log_dir,
        launch.start_timeout,
        lambda url: ServerClient(url).healthy(),
        dtype=settings.dtype,
        max_model_len=settings.max_model_len,
        kv_cache_bytes=settings.kv_cache_memory_bytes,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        extra_args=list(launch.args),
        cpus=launch.cpus,
        transfer_backend=TRANSFER_BACKENDS[settings.transfer.backend],
    )
    clients = [ServerClient(p.url, settings.request_timeout) for p in processes]
    owned = str(model_dir) if owns_model_dir else None
    return ServerEngine(clients, processes=processes, pusher=True, owned_dir=owned, **common)


def _next_version(clients: list[ServerClient]) -> int:
    """One above the highest weight version any server reports (0 for servers never pushed to)."""
    return max(version_number(client.weight_version()) + 1 for client in clients)
