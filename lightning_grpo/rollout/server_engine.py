"""Rollouts on one or more vLLM servers (``engine: vllm_server``), weights pushed through vLLM's RL API.

:class:`ServerEngine` implements the same :class:`~lightning_grpo.rollout.base.RolloutEngine`
interface as the in-process engines. One request per prompt (``n = G`` samples) with its own
seed (:func:`~lightning_grpo.rollout.base.request_seed`, as the in-process engine; vLLM gives
sample ``i`` of a request ``seed + i``), so no two samples of a call share a random stream.
Prompts are dealt round-robin over the live servers and sent concurrently (data-parallel
rollout). A server that stops answering is marked dead and its prompts go to the others; when
none is left, :class:`NoServerLeftError` names every URL.

Every sample carries the weight version that produced it (the server reports it per sample);
:meth:`ServerEngine.load_weights` prepares the weights once with the engine's transport and each
server loads them through vLLM's RL API, then records the version. Transports, matching the
server's ``--weight-transfer-config`` backend: shared-memory buckets for servers on the trainer's
machine (:mod:`~lightning_grpo.rollout.shm_transfer`), TCP for CPU servers anywhere
(:mod:`~lightning_grpo.rollout.tcp_transfer`), vLLM's NCCL backend for GPU servers anywhere
(:mod:`~lightning_grpo.rollout.nccl_transfer`).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from lightning_grpo.rollout.engine_settings import ENGINE_ARGS

from .base import Rollout, RolloutEngine, SamplingConfig, check_fits, request_seed, validate_prompts
from .server_client import Sample, ServerClient, ServerUnavailableError, version_number
from .shm_transfer import BUCKET_BYTES, ShmTransport

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class NoServerLeftError(RuntimeError):
    """Every vLLM server of the engine stopped answering."""


class ServerEngine(RolloutEngine):
    """Samples on vLLM servers; see the module docstring.

    Args:
        clients: one :class:`ServerClient` per server.
        dtype: the servers' dtype (pushed weights are cast to it).
        max_model_len: the servers' longest prompt + completion (checked before sending; None = unchecked).
        pusher: this process pushes weights (DDP: rank 0 only). Other processes' ``load_weights``
            waits until every server reports the version instead.
        bucket_bytes: bytes per shared-memory bucket (one ``/update_weights`` call each).
        processes: child :class:`~lightning_grpo.rollout.server_process.ServerProcess` objects
            stopped by :meth:`close` (servers this engine started).
        version_timeout: seconds a non-pushing process waits for a version to reach the servers.
        transport: how pushed weights travel (``prepare`` / ``push`` / ``release`` / ``close``); None =
            shared memory (:class:`~lightning_grpo.rollout.shm_transfer.ShmTransport`).
        version_base: added to this run's versions on the servers (servers reused from an earlier
            run: one above the version it left), so a waiting rank never takes an old push for a new one.
    """

    needs_weight_sync = True

    def __init__(
        self,
        clients: list[ServerClient],
        *,
        dtype: str = "float32",
        max_model_len: int | None = None,
        pusher: bool = True,
        bucket_bytes: int = BUCKET_BYTES,
        processes: list | None = None,
        version_timeout: float = 600.0,
        transport: Any = None,
        version_base: int = 0,
        owned_dir: str | None = None,
    ) -> None:
        if not clients:
            raise ValueError("ServerEngine needs at least one server")
        if dtype not in _DTYPES:
            raise ValueError(f"ServerEngine dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
        self.clients = list(clients)
        self.dead: dict[str, str] = {}  # url -> why it was dropped
        self.dtype = _DTYPES[dtype]
        self.max_model_len = max_model_len
        self.pusher = pusher
        self.bucket_bytes = bucket_bytes
        self.processes = list(processes or [])
        self._owned_dir = owned_dir  # the started servers' model folder, a copy made for them: removed at close
        self.version_timeout = version_timeout
        self.transport = transport if transport is not None else ShmTransport()
        self.version = -1  # weight version last pushed (or awaited), this run's numbering
        # servers shared by runs: this run tags its pushes ``version_base + version``, above every
        # version an earlier run left on them, so a waiting rank never takes an old push for a new one
        self.version_base = int(version_base)
        self.last_push_seconds = 0.0
        self._pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="vllm-server-request")

    @property
    def urls(self) -> list[str]:
        return [c.url for c in self.clients]

    def live_clients(self) -> list[ServerClient]:
        live = [c for c in self.clients if c.url not in self.dead]
        if not live:
            reasons = "; ".join(f"{url}: {why}" for url, why in self.dead.items())
            raise NoServerLeftError(f"no vLLM server left ({reasons})")
        return live

    def _drop(self, client: ServerClient, err: Exception) -> None:
        self.dead.setdefault(client.url, str(err))

    # -------------------------------------------------------------- generation
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig, seed: int) -> Rollout:
        """Sample ``sampling.n`` completions per prompt on the servers; every row carries the weight
        version that sampled it (:attr:`Rollout.versions`)."""
        validate_prompts(prompt_ids)
        if self.max_model_len is not None:
            check_fits(
                prompt_ids, sampling.max_new_tokens, self.max_model_len, "servers'", f"{ENGINE_ARGS}.max_model_len"
            )
        stop_token_ids = sampling.stop_token_ids
        base = {
            "n": sampling.n,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "max_tokens": sampling.max_new_tokens,
            **({"stop_token_ids": list(stop_token_ids)} if stop_token_ids else {}),
        }
        params = [{**base, "seed": request_seed(seed, p)} for p in range(len(prompt_ids))]
        results: list[list[Sample] | None] = [None] * len(prompt_ids)
        pending = list(range(len(prompt_ids)))
        while pending:
            live = self.live_clients()
            sent = []
            for i, p in enumerate(pending):
                client = live[i % len(live)]
                sent.append((p, client, self._pool.submit(client.generate, prompt_ids[p], params[p])))
            pending = []
            for p, client, future in sent:
                try:
                    results[p] = future.result()
                except ServerUnavailableError as err:  # retried on the servers still answering
                    self._drop(client, err)
                    pending.append(p)
        return _to_rollout(prompt_ids, results, sampling.n, self.version_base)

    def score(self, sequences: list[list[int]]) -> dict[str, list[torch.Tensor]]:
        """Log-probs of ``sequences[i][1:]`` on every live server (its prompt log-probs), keyed by URL."""
        validate_prompts(sequences)
        if self.max_model_len is not None:
            check_fits(sequences, 1, self.max_model_len, "servers'", f"{ENGINE_ARGS}.max_model_len")
        scores: dict[str, list[torch.Tensor]] = {}
        for client in self.live_clients():
            try:
                scores[client.url] = [torch.tensor(client.prompt_logprobs(s), dtype=torch.float32) for s in sequences]
            except ServerUnavailableError as err:
                self._drop(client, err)
        self.live_clients()  # raise if none is left
        return scores

    # ------------------------------------------------------------- weight push
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int | None = None) -> None:
        """Push ``(hf_name, tensor)`` pairs to every live server and tag them ``version`` (default:
        the last version + 1). A non-pushing process (DDP rank > 0) waits for the version instead."""
        self.send_push(self.prepare_push(weights), self.version + 1 if version is None else int(version))

    def prepare_push(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Any:
        """Snapshot the weights for the transport (the caller may change them afterwards)."""
        return self.transport.prepare(weights, self.dtype, self.bucket_bytes) if self.pusher else None

    def send_push(self, prepared: Any, version: int) -> None:
        """Load prepared weights into every live server as ``version`` (then release them); a
        non-pushing process waits until every server reports ``version``."""
        start = time.perf_counter()
        if prepared is None:
            self.wait_for_version(version)
        else:
            tag = self.version_base + version
            try:
                pushes = [(c, self._pool.submit(self.transport.push, c, prepared, tag)) for c in self.live_clients()]
                for client, future in pushes:
                    try:
                        future.result()
                    except ServerUnavailableError as err:
                        self._drop(client, err)
                self.live_clients()  # raise if the push lost every server
            finally:
                self.transport.release(prepared)
        self.version = version
        self.last_push_seconds = time.perf_counter() - start

    def wait_for_version(self, version: int) -> None:
        """Block until every live server reports weight version >= ``version`` (this run's numbering)."""
        version += self.version_base
        deadline = time.monotonic() + self.version_timeout
        for client in self.live_clients():
            while True:
                try:
                    reported = client.weight_version()
                except ServerUnavailableError as err:
                    self._drop(client, err)
                    break
                if version_number(reported) >= version:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"vLLM server {client.url} still has weight version {reported}, waited for {version} "
                        f"(version {version - self.version_base} of this run)"
                    )
                time.sleep(0.05)
        self.live_clients()

    def close(self) -> None:
        """Stop the servers this engine started (user-run servers are left running) and remove the model
        folder copy it owns."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.transport.close()
        for process in self.processes:
            process.stop()
        self.processes = []
        if self._owned_dir is not None:
            shutil.rmtree(self._owned_dir, ignore_errors=True)
            self._owned_dir = None


def _to_rollout(prompt_ids: list[list[int]], results: list[list[Sample]], n: int, base: int = 0) -> Rollout:
    """Samples as one rollout; versions in this run's numbering (-1: weights this run never pushed)."""
    samples = [s for per_prompt in results for s in per_prompt]
    return Rollout(
        prompt_ids=[list(p) for p in prompt_ids],
        completion_ids=[s.token_ids for s in samples],
        logprobs=[s.logprobs for s in samples],
        finished=[s.finished for s in samples],
        group_size=n,
        versions=[s.version - base if s.version >= base else -1 for s in samples],
    )
