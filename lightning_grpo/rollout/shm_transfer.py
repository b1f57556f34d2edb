"""Trainer side of the ``lightning_grpo_shm`` weight transfer: tensors into shared-memory buckets.

vLLM's RL API moves weights with a *weight transfer engine* chosen by the server's
``--weight-transfer-config '{"backend": ...}'``; vLLM ships NCCL and CUDA-IPC backends, neither of
which exists on CPU. ``lightning_grpo_shm`` (registered in the server through vLLM's plugin
mechanism, :mod:`lightning_grpo.rollout.vllm_plugin`) is a CPU backend for a server on the same machine:
the trainer writes the weights, cast to the server's dtype, into files under ``/dev/shm``
(about 64 MiB each, one ``/update_weights`` call per file) and the server maps each file and
loads its tensors with the model's own ``load_weights`` (HF checkpoint names).

This module imports torch only; the server side is
:class:`lightning_grpo.rollout.vllm_plugin.ShmWeightTransferEngine`.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterable, Iterator

import torch

BACKEND = "lightning_grpo_shm"
#: Bytes per shared-memory bucket (one ``/update_weights`` request each); a larger tensor gets its own.
BUCKET_BYTES = 64 * 1024**2
_ALIGN = 64  # every tensor starts at a multiple of this many bytes (dtype views need alignment)
_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def shm_directory() -> str:
    """Where buckets are written: ``/dev/shm`` (RAM-backed) when it exists, else the temp dir."""
    return "/dev/shm" if os.path.isdir("/dev/shm") else os.environ.get("TMPDIR", "/tmp")


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def plan_buckets(sizes: list[int], bucket_bytes: int) -> list[list[int]]:
    """Indices of the tensors of each bucket, in order: a bucket takes tensors until the next one
    would push it past ``bucket_bytes`` (a tensor larger than that gets a bucket of its own)."""
    buckets: list[list[int]] = []
    used = 0
    for i, size in enumerate(sizes):
        if not buckets or (used + _aligned(size) > bucket_bytes and buckets[-1]):
            buckets.append([])
            used = 0
        buckets[-1].append(i)
        used += _aligned(size)
    return buckets


class ShmBuckets:
    """Weights written to shared-memory files; ``update_infos`` are the ``/update_weights`` payloads.

    Remove the files with :meth:`unlink` once every server has finished loading them (the
    server's mapping stays valid after that)."""

    def __init__(self, paths: list[str], update_infos: list[dict]) -> None:
        self.paths = paths
        self.update_infos = update_infos

    @property
    def nbytes(self) -> int:
        return sum(os.path.getsize(p) for p in self.paths if os.path.exists(p))

    def unlink(self) -> None:
        for path in self.paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def pack_buckets(
    weights: Iterable[tuple[str, torch.Tensor]],
    dtype: torch.dtype,
    bucket_bytes: int,
    allocate: Callable[[int, int], torch.Tensor],
) -> list[dict]:
    """Cast ``(hf_name, tensor)`` pairs to ``dtype`` and copy them into buckets, each a uint8 buffer
    from ``allocate(bucket_index, nbytes)``; returns one layout per bucket (``names``, ``dtype``,
    ``shapes``, byte ``offsets``, ``nbytes``). Shared by the shared-memory and the TCP transfers."""
    if dtype not in _DTYPE_NAMES:
        raise ValueError(f"weight transfer: dtype must be one of {sorted(_DTYPE_NAMES.values())}, got {dtype}")
    pairs = [(name, t.detach()) for name, t in weights]
    sizes = [t.numel() * dtype.itemsize for _, t in pairs]
    layouts = []
    for b, indices in enumerate(plan_buckets(sizes, bucket_bytes)):
        offsets, offset = [], 0
        for i in indices:
            offsets.append(offset)
            offset += _aligned(sizes[i])
        buffer = allocate(b, max(offset, _ALIGN))  # [nbytes] uint8
        for i, start in zip(indices, offsets):
            name, tensor = pairs[i]
            view = buffer[start : start + sizes[i]].view(dtype).view(tensor.shape)
            view.copy_(tensor.to(device="cpu"))
        del buffer
        layouts.append(
            {
                "names": [pairs[i][0] for i in indices],
                "dtype": _DTYPE_NAMES[dtype],
                "shapes": [list(pairs[i][1].shape) for i in indices],
                "offsets": offsets,
                "nbytes": max(offset, _ALIGN),
            }
        )
    return layouts


def write_buckets(
    weights: Iterable[tuple[str, torch.Tensor]],
    dtype: torch.dtype,
    bucket_bytes: int = BUCKET_BYTES,
    directory: str | None = None,
) -> ShmBuckets:
    """Cast ``(hf_name, tensor)`` pairs to ``dtype`` and write them into shared-memory buckets."""
    directory = directory or shm_directory()
    stem = f"lightning-grpo-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    paths: list[str] = []

    def allocate(b: int, nbytes: int) -> torch.Tensor:
        paths.append(os.path.join(directory, f"{stem}-{b}"))
        return _mapped(paths[-1], nbytes)

    layouts = pack_buckets(weights, dtype, bucket_bytes, allocate)
    infos = []
    for path, layout in zip(paths, layouts):
        layout.pop("nbytes")
        infos.append({"path": path, **layout})
    return ShmBuckets(paths, infos)


def _mapped(path: str, nbytes: int) -> torch.Tensor:
    with open(path, "wb") as f:
        f.truncate(nbytes)
    return torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)


def bucket_tensors(
    buffer: torch.Tensor, names: list[str], dtype: str, shapes: list[list[int]], offsets: list[int]
) -> Iterator[tuple[str, torch.Tensor]]:
    """The ``(name, tensor)`` views of one bucket's uint8 ``buffer`` (receiving side of both transfers)."""
    torch_dtype = getattr(torch, dtype)
    for name, shape, start in zip(names, shapes, offsets):
        size = int(torch.Size(shape).numel()) * torch_dtype.itemsize
        yield name, buffer[start : start + size].view(torch_dtype).view(shape)


def read_bucket(
    path: str, names: list[str], dtype: str, shapes: list[list[int]], offsets: list[int]
) -> Iterator[tuple[str, torch.Tensor]]:
    """The ``(name, tensor)`` pairs of one bucket (server side), read from a private mapping of the file."""
    torch_dtype = getattr(torch, dtype)
    sizes = [int(torch.Size(s).numel()) * torch_dtype.itemsize for s in shapes]
    end = max((o + s for o, s in zip(offsets, sizes)), default=0)
    buffer = torch.from_file(path, shared=False, size=max(end, 1), dtype=torch.uint8)  # [end] uint8
    return bucket_tensors(buffer, names, dtype, shapes, offsets)


class ShmTransport:
    """Trainer side of ``lightning_grpo_shm`` for :class:`~lightning_grpo.rollout.server_engine.ServerEngine`:
    buckets written once into ``/dev/shm`` files, each server loads them by path."""

    backend = BACKEND

    def prepare(self, weights: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype, bucket_bytes: int) -> ShmBuckets:
        return write_buckets(weights, dtype, bucket_bytes)

    def push(self, client, buckets: ShmBuckets, version: int) -> None:
        if not client.transfer_ready:
            client.init_transfer({})
        client.push(buckets.update_infos, version)

    def release(self, buckets: ShmBuckets) -> None:
        buckets.unlink()

    def close(self) -> None:
        pass
