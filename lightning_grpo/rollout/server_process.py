"""Start vLLM OpenAI-compatible servers as child processes, wait for them, shut them down.

A :class:`ServerProcess` runs vLLM's own API server module (what ``vllm serve`` runs:
``python -m vllm.entrypoints.launchers.api_server.entry``) with the options the trainer relies on:

- ``VLLM_SERVER_DEV_MODE=1``: exposes the RL endpoints (``/pause``, ``/start_weight_update``, ...);
- ``--enable-scale-out``: the token-in / token-out endpoint ``/inference/v1/generate``;
- ``--weight-transfer-config {"backend": "lightning_grpo_shm"}`` (our plugin backend; or
  ``lightning_grpo_tcp`` / vLLM's ``nccl`` as ``rollout.engine.init_args.transfer.backend`` says);
- ``--logprobs-mode processed_logprobs``: log-probs after temperature, as the trainer computes them.

The child's stdout and stderr go to ``<log_dir>/vllm-server-<port>.log``. The server finds the
plugin through the ``vllm.general_plugins`` entry point of the installed package, which acts only
where ``LIGHTNING_GRPO_VLLM_PLUGIN=1`` (set here, :mod:`lightning_grpo.vllm_entry`); the launcher
also puts a small generated ``.dist-info`` on the child's ``PYTHONPATH`` that points at the
``lightning_grpo`` being run, so a source checkout that is not the installed copy works too.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning_grpo
from lightning_grpo.vllm_entry import ENV as PLUGIN_ENV

#: Name of the generated distribution that carries the plugin entry point for child servers.
_PLUGIN_DIST = "lightning_grpo_server_plugin-0.dist-info"


class ServerStartError(RuntimeError):
    """A child vLLM server did not become healthy (the message names the URL and the log file)."""


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True if something already listens on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def plugin_path(directory: Path) -> Path:
    """Write (once) a ``.dist-info`` declaring our ``vllm.general_plugins`` entry point into
    ``directory`` and return ``directory`` (to prepend to the child's ``PYTHONPATH``)."""
    dist = directory / _PLUGIN_DIST
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: lightning-grpo-server-plugin\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(
        "[vllm.general_plugins]\nlightning_grpo = lightning_grpo.vllm_entry:register\n"
    )
    return directory


def server_command(
    model: str,
    port: int,
    host: str,
    dtype: str,
    max_model_len: int,
    extra_args: list[str],
    transfer_backend: str = "lightning_grpo_shm",
) -> list[str]:
    """The child's command line (vLLM's API server module, our required options first)."""
    return [
        sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry",
        "--model", model, "--host", host, "--port", str(port),
        "--dtype", dtype, "--max-model-len", str(max_model_len),
        "--enforce-eager", "--enable-scale-out", "--logprobs-mode", "processed_logprobs",
        "--weight-transfer-config", json.dumps({"backend": transfer_backend}),
        "--enable-prefix-caching", "--disable-uvicorn-access-log",
        *extra_args,
    ]  # fmt: skip  # option and value pairs, one group a line


class ServerProcess:
    """One vLLM server child process (start with :meth:`start`, then :meth:`wait_healthy`)."""

    def __init__(
        self,
        model: str,
        port: int,
        log_dir: str | os.PathLike,
        *,
        host: str = "127.0.0.1",
        dtype: str = "float32",
        max_model_len: int = 512,
        kv_cache_bytes: int | None = 64 * 1024**2,
        max_num_batched_tokens: int | None = None,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        cpus: list[int] | None = None,
        transfer_backend: str = "lightning_grpo_shm",
    ) -> None:
        self.model, self.port, self.host = str(model), int(port), host
        self.log_dir = Path(log_dir)
        self.log_path = self.log_dir / f"vllm-server-{self.port}.log"
        args = _scheduler_args(max_model_len, max_num_batched_tokens, list(extra_args or []))
        if kv_cache_bytes is not None:
            args += ["--kv-cache-memory-bytes", str(kv_cache_bytes)]
        self.command = server_command(self.model, self.port, host, dtype, max_model_len, args, transfer_backend)
        self.env = dict(env or {})
        self.cpus = list(cpus) if cpus else None  # CPU affinity of the server (and its engine processes)
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> ServerProcess:
        """Launch the child; raise ServerStartError right away if the port is taken or the model
        directory has no ``config.json``."""
        if port_in_use(self.port, self.host):
            raise ServerStartError(f"cannot start a vLLM server at {self.url}: port {self.port} is already in use")
        if not (Path(self.model) / "config.json").is_file():
            raise ServerStartError(
                f"cannot start a vLLM server at {self.url}: model path {self.model!r} is not a directory with a config.json"
            )
        self.log_dir.mkdir(parents=True, exist_ok=True)
        package_root = str(Path(lightning_grpo.__file__).resolve().parent.parent)
        paths = [str(plugin_path(self.log_dir / "vllm-plugin")), package_root, os.environ.get("PYTHONPATH", "")]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in paths if p),
            "VLLM_SERVER_DEV_MODE": "1",
            PLUGIN_ENV: "1",  # our vLLM plugin registers its weight transfer backends in this server
            "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
            "TORCHDYNAMO_DISABLE": "1",
            "VLLM_LOGGING_LEVEL": os.environ.get("LIGHTNING_GRPO_SERVER_LOG_LEVEL", "INFO"),
            **self.env,
        }
        with open(self.log_path, "ab") as log:  # the child holds its own descriptor
            pin = (lambda: os.sched_setaffinity(0, self.cpus)) if self.cpus else None
            self.process = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, preexec_fn=pin
            )
        return self

    def wait_healthy(self, timeout: float, is_healthy: Callable[[], bool]) -> None:
        """Poll ``is_healthy`` until it returns True; raise ServerStartError naming the URL and the
        log file if the child exits or ``timeout`` seconds pass first (the child is then stopped)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                self.stop()
                raise ServerStartError(
                    f"vLLM server at {self.url} exited with code {self.process.returncode} before becoming healthy; "
                    f"see its log {self.log_path}{_log_tail(self.log_path)}"
                )
            if is_healthy():
                return
            time.sleep(0.5)
        self.stop()
        raise ServerStartError(
            f"vLLM server at {self.url} did not become healthy within {timeout:.0f} s (rollout.engine.init_args.launch.start_timeout); "
            f"see its log {self.log_path}{_log_tail(self.log_path)}"
        )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, grace: float = 10.0) -> None:
        """Terminate the child (its process group: vLLM's engine core is a grandchild), then kill."""
        if self.process is None or self.process.poll() is not None:
            return
        import signal

        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue


def _scheduler_args(max_model_len: int, max_num_batched_tokens: int | None, extra_args: list[str]) -> list[str]:
    """``extra_args`` with the prefill settings first: on CPU chunked prefill off and a budget that holds
    any prompt (:func:`~lightning_grpo.rollout.prefill.cpu_server_args`); elsewhere the budget if set."""
    from .prefill import cpu_server_args, is_cpu_platform

    if is_cpu_platform():
        return cpu_server_args(max_model_len, max_num_batched_tokens, extra_args) + extra_args
    if max_num_batched_tokens is not None:
        return ["--max-num-batched-tokens", str(max_num_batched_tokens)] + extra_args
    return extra_args


def _log_tail(path: Path, lines: int = 8) -> str:
    try:
        tail = path.read_text(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return ""
    return ("\nlast lines of the log:\n  " + "\n  ".join(tail)) if tail else ""


def start_servers(
    model: str, count: int, log_dir: str | os.PathLike, timeout: float, is_healthy: Callable[[str], bool], **kwargs: Any
) -> list[ServerProcess]:
    """Start ``count`` servers on free ports, all at once, and wait until each is healthy (every one
    is stopped if any fails)."""
    servers = [ServerProcess(model, free_port(), log_dir, **kwargs) for _ in range(count)]
    try:
        for server in servers:
            server.start()
        for server in servers:
            server.wait_healthy(timeout, lambda s=server: is_healthy(s.url))
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers
