"""The ``lightning_grpo_tcp`` weight transfer: weights to vLLM servers on other machines, over TCP.

The shared-memory transfer (:mod:`~lightning_grpo.rollout.shm_transfer`) needs the trainer and the
server on one machine; vLLM's NCCL backend needs GPUs on both sides. This one needs a TCP route
from each server to the trainer, nothing else (CPU servers on other machines, or any server where
NCCL is not wanted). It goes through vLLM's RL API like the others, on the same pattern as vLLM's
NCCL backend (a control request per bucket over HTTP, the bytes over a separate channel):

1. The trainer listens on one TCP port (``rollout.engine.init_args.transfer.host`` / ``.port``; by default
   the trainer's address on the route to the server and a free port).
2. ``POST /init_weight_transfer_engine {"host", "port", "token"}``: every worker of the server
   connects to that port and says hello (magic, the token, its rank and world size); the trainer
   accepts as many connections as ``GET /get_world_size`` reports.
3. Each push: ``/start_weight_update``; per bucket of about 64 MiB, ``/update_weights`` with the
   bucket's layout (names, dtype, shapes, offsets, size, an update id) while the trainer writes a
   header (magic, update id, size) and the bucket's bytes to every worker's socket; the worker reads
   them and loads the tensors with the model's ``load_weights``; ``/finish_weight_update``.

Buckets use the same layout as the shared-memory transfer (tensors cast to the server's dtype,
64-byte aligned). The bytes are a snapshot taken when the push is prepared, so the asynchronous
pipeline can keep training while they are sent. Standard library and torch only; the server side
is :class:`lightning_grpo.rollout.vllm_plugin.TcpWeightTransferEngine`.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import uuid
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlparse

import torch

from lightning_grpo.rollout.engine_settings import ENGINE_ARGS

from .shm_transfer import pack_buckets

BACKEND = "lightning_grpo_tcp"
MAGIC = b"LGRPOTCP"
#: Worker -> trainer, once per connection: magic, token (16 bytes), worker rank, world size.
HELLO = struct.Struct("!8s16sII")
#: Trainer -> worker, before each bucket's bytes: magic, update id, byte count.
HEADER = struct.Struct("!8sQQ")


class TcpBuckets:
    """Weights packed into in-memory buckets: ``layouts`` (one ``/update_weights`` payload each, without
    the update id) and the matching uint8 ``blobs``."""

    def __init__(self, layouts: list[dict], blobs: list[torch.Tensor]) -> None:
        self.layouts, self.blobs = layouts, blobs

    def unlink(self) -> None:
        self.blobs = []


def pack_tcp(weights: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype, bucket_bytes: int) -> TcpBuckets:
    blobs: list[torch.Tensor] = []

    def allocate(b: int, nbytes: int) -> torch.Tensor:
        blobs.append(torch.empty(nbytes, dtype=torch.uint8))
        return blobs[-1]

    return TcpBuckets(pack_buckets(weights, dtype, bucket_bytes, allocate), blobs)


def local_address_towards(url: str) -> str:
    """This machine's address on the route to ``url``'s host (no packet is sent: a UDP socket is
    only connected). Loopback for a server on this machine."""
    host = urlparse(url).hostname or "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, 9))
        return probe.getsockname()[0]


class TcpTransport:
    """Trainer side: one listening socket, the workers' connections per server, the sends.

    Args:
        host: address the servers connect to (this machine's, reachable from them); None = the
            address on the route to the first server.
        port: port to listen on; 0 = a free one.
        timeout: seconds for a connection or a send to make progress.
    """

    backend = BACKEND

    def __init__(self, host: str | None = None, port: int = 0, timeout: float = 600.0) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self._listener: socket.socket | None = None
        self._channels: dict[str, list[socket.socket]] = {}  # server url -> its workers' sockets, by rank
        self._update_id = 0

    def prepare(self, weights: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype, bucket_bytes: int) -> TcpBuckets:
        return pack_tcp(weights, dtype, bucket_bytes)

    def release(self, buckets: TcpBuckets) -> None:
        buckets.unlink()

    def push(self, client: Any, buckets: TcpBuckets, version: int) -> None:
        """Load ``buckets`` into the server of ``client`` as weight ``version``."""
        if client.url not in self._channels:
            self._connect(client)
        sockets = self._channels[client.url]
        infos, first = [], self._update_id
        for i, layout in enumerate(buckets.layouts):
            infos.append({**layout, "update_id": first + i})
        self._update_id += len(infos)

        def send(i: int) -> None:
            header = HEADER.pack(MAGIC, first + i, infos[i]["nbytes"])
            payload = memoryview(buckets.blobs[i].numpy())
            for sock in sockets:
                sock.sendall(header)
                sock.sendall(payload)

        def abort() -> None:  # the server failed the request: unblock a send it will never read
            for sock in sockets:
                _shutdown(sock)

        def load(i: int, info: dict) -> None:
            send_while(lambda: client.update_weights(info), lambda: send(i), abort)

        try:
            client.push(infos, version, load_bucket=load)
        except BaseException:
            self._disconnect(client.url)  # the stream may be out of step: the next push connects again
            raise

    def _connect(self, client: Any) -> None:
        listener = self._listen(client.url)
        host, port = listener.getsockname()[:2]
        token = uuid.uuid4().bytes
        world = client.world_size()
        client.init_transfer({"host": self.host or host, "port": port, "token": token.hex(), "timeout": self.timeout})
        workers: dict[int, socket.socket] = {}
        while len(workers) < world:
            try:
                sock, _ = listener.accept()
            except TimeoutError as err:
                raise ConnectionError(
                    f"vLLM server {client.url}: {len(workers)} of {world} workers connected to {host}:{port} "
                    f"within {self.timeout:.0f} s (can the server reach this address? {ENGINE_ARGS}.transfer.host)"
                ) from err
            sock.settimeout(self.timeout)
            rank = _read_hello(sock, token, client.url)
            workers[rank] = sock
        self._channels[client.url] = [workers[r] for r in sorted(workers)]

    def _listen(self, url: str) -> socket.socket:
        if self._listener is None:
            host = self.host or local_address_towards(url)
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host, self.port))
            listener.listen(64)
            listener.settimeout(self.timeout)
            self._listener = listener
        return self._listener

    def _disconnect(self, url: str) -> None:
        for sock in self._channels.pop(url, []):
            sock.close()

    def close(self) -> None:
        for url in list(self._channels):
            self._disconnect(url)
        if self._listener is not None:
            self._listener.close()
            self._listener = None


def _read_hello(sock: socket.socket, token: bytes, url: str) -> int:
    magic, got, rank, _world = HELLO.unpack(recv_exact(sock, HELLO.size))
    if magic != MAGIC or got != token:
        sock.close()
        raise ConnectionError(
            f"vLLM server {url}: a connection to the weight-transfer port did not present this push's token"
        )
    return rank


def recv_exact(sock: socket.socket, nbytes: int, into: memoryview | None = None) -> bytes | memoryview:
    """Read exactly ``nbytes`` from ``sock`` (into ``into`` when given); ConnectionError if it closes first."""
    view = into if into is not None else memoryview(bytearray(nbytes))
    got = 0
    while got < nbytes:
        n = sock.recv_into(view[got:], nbytes - got)
        if n == 0:
            raise ConnectionError(f"weight transfer: the connection closed after {got} of {nbytes} bytes")
        got += n
    return view if into is not None else bytes(view)


# ------------------------------------------------------------------------------ server side
def connect_to_trainer(host: str, port: int, token: str, rank: int, world: int, timeout: float) -> socket.socket:
    """Worker side of step 2: connect and say hello."""
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.sendall(HELLO.pack(MAGIC, bytes.fromhex(token), rank, world))
    return sock


def receive_bucket(sock: socket.socket, update_id: int, nbytes: int) -> torch.Tensor:
    """Worker side of step 3: the bytes of bucket ``update_id`` as a uint8 tensor ``[nbytes]``."""
    magic, got_id, got_bytes = HEADER.unpack(recv_exact(sock, HEADER.size))
    if magic != MAGIC or got_id != update_id or got_bytes != nbytes:
        raise ConnectionError(
            f"weight transfer out of step: expected bucket {update_id} ({nbytes} bytes), the trainer sent "
            f"{got_id} ({got_bytes} bytes)"
        )
    buffer = torch.empty(nbytes, dtype=torch.uint8)
    recv_exact(sock, nbytes, memoryview(buffer.numpy()))
    return buffer


def send_while(request: Callable[[], Any], send: Callable[[], None], abort: Callable[[], None]) -> Any:
    """Run ``send`` in a thread while ``request`` (the ``/update_weights`` call that makes the worker
    read) runs here; re-raise the sender's error after the request returns. If the request fails,
    ``abort`` first unblocks the sender (the server will not read the rest)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            send()
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(err)

    thread = threading.Thread(target=run, name="weight-transfer-send", daemon=True)
    thread.start()
    try:
        result = request()
    except BaseException:
        abort()
        thread.join()
        raise
    thread.join()
    if errors:
        raise errors[0]
    return result


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
