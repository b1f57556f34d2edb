"""HTTP client of one vLLM server: token-in / token-out generation and the RL weight-update API.

Endpoints used (vLLM 0.32, server started with ``VLLM_SERVER_DEV_MODE=1`` and
``--enable-scale-out``; :mod:`~lightning_grpo.rollout.server_process` does both):

- ``GET /health``; ``GET /weight_info`` (the version set by the last push);
- ``POST /inference/v1/generate``: prompt token ids + ``SamplingParams`` in; per sample the
  token ids, the sampled tokens' log-probs and the weight version(s) that produced them out;
- ``POST /pause``, ``/init_weight_transfer_engine``, ``/start_weight_update``, ``/update_weights``
  (one per bucket), ``/finish_weight_update``, ``/reset_prefix_cache``, ``/resume``.

Standard library only (``urllib``), so the trainer does not need vLLM installed to use a server.
"""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple


class ServerUnavailableError(ConnectionError):
    """A server did not answer (refused, reset, timed out); the message names its URL."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"vLLM server {url} is not answering: {reason}")
        self.url = url


class ServerRequestError(RuntimeError):
    """A server answered with an error status (a bad request, not an outage)."""


class Sample(NamedTuple):
    token_ids: list[int]
    logprobs: list[float]  # log-prob of each sampled token (processed: after temperature)
    finished: bool  # ended with a stop token (EOS or stop_token_ids), not the length limit
    version: int  # weight version that sampled it (-1: weights the server loaded from disk)


class ServerClient:
    """Talks to one vLLM server at ``url`` (``http://host:port``)."""

    def __init__(self, url: str, timeout: float = 600.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.transfer_ready = False  # /init_weight_transfer_engine was called

    def _request(
        self, method: str, path: str, body: dict | None = None, params: str = "", timeout: float | None = None
    ) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"{self.url}{path}{'?' + params if params else ''}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"} if data is not None else {},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout or self.timeout) as response:
                payload = response.read()
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")[:500]
            raise ServerRequestError(f"vLLM server {self.url}{path} answered {err.code}: {detail}") from err
        except (urllib.error.URLError, ConnectionError, TimeoutError) as err:
            raise ServerUnavailableError(self.url, f"{path}: {getattr(err, 'reason', err)}") from err
        return json.loads(payload) if payload else None

    # ------------------------------------------------------------------ status
    def healthy(self) -> bool:
        """True if ``/health`` answers 200 right now."""
        try:
            self._request("GET", "/health", timeout=2.0)
            return True
        except (ServerUnavailableError, ServerRequestError):
            return False

    def weight_version(self) -> str:
        return str(self._request("GET", "/weight_info")["weight_version"])

    # -------------------------------------------------------------- generation
    def generate(self, prompt_ids: list[int], params: dict[str, Any]) -> list[Sample]:
        """Sample ``params["n"]`` completions of one prompt (``params``: vLLM ``SamplingParams`` fields)."""
        body = {"token_ids": list(prompt_ids), "sampling_params": {**params, "logprobs": 0}}
        out = self._request("POST", "/inference/v1/generate", body)
        samples = []
        for choice in sorted(out["choices"], key=lambda c: c["index"]):
            ids = list(choice["token_ids"])
            content = (choice.get("logprobs") or {}).get("content") or []
            if len(content) != len(ids):
                raise ServerRequestError(
                    f"vLLM server {self.url} returned {len(content)} log-probs for {len(ids)} tokens"
                )
            samples.append(
                Sample(ids, [float(c["logprob"]) for c in content], choice["finish_reason"] == "stop", _version(choice))
            )
        return samples

    def prompt_logprobs(self, token_ids: list[int], temperature: float = 1.0) -> list[float]:
        """Log-probs of ``token_ids[1:]`` given their prefixes under the server's weights."""
        params = {"n": 1, "temperature": temperature, "max_tokens": 1, "prompt_logprobs": 0}
        out = self._request("POST", "/inference/v1/generate", {"token_ids": list(token_ids), "sampling_params": params})
        rows = out["prompt_logprobs"]
        return [float(rows[i][str(token_ids[i])]["logprob"]) for i in range(1, len(token_ids))]

    # ------------------------------------------------------------- weight push
    def world_size(self) -> int:
        """Workers of the server (tensor x pipeline x data parallel): each joins a weight transfer."""
        return int(self._request("GET", "/get_world_size")["world_size"])

    def init_transfer(self, init_info: dict) -> None:
        """``/init_weight_transfer_engine`` (once per server; the transfer's rendezvous, if any)."""
        self._request("POST", "/init_weight_transfer_engine", {"init_info": init_info})
        self.transfer_ready = True

    def update_weights(self, update_info: dict) -> None:
        """``/update_weights``: the server loads one bucket."""
        self._request("POST", "/update_weights", {"update_info": update_info})

    def push(
        self, update_infos: list[dict], version: int, load_bucket: Callable[[int, dict], None] | None = None
    ) -> None:
        """One weight update: pause (finish running requests), load every bucket (``load_bucket(i, info)``,
        default :meth:`update_weights`), set ``version``, drop the prefix cache (its KV was computed by
        the old weights), resume. The transfer must be initialised (:meth:`init_transfer`)."""
        load = load_bucket or (lambda i, info: self.update_weights(info))
        with self.paused():
            self.start_update()
            for i, info in enumerate(update_infos):
                load(i, info)
            self.finish_update(version)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """``/pause`` (running requests finish first) ... ``/resume``."""
        self._request("POST", "/pause", params="mode=wait")
        try:
            yield
        finally:
            self._request("POST", "/resume")

    def start_update(self) -> None:
        self._request("POST", "/start_weight_update")

    def finish_update(self, version: int) -> None:
        """``/finish_weight_update`` tagged ``version``, then drop the prefix cache."""
        self._request("POST", "/finish_weight_update", {"weight_version": str(version)})
        self._request("POST", "/reset_prefix_cache")


def version_number(reported: Any) -> int:
    """A weight version a server reports, as a number (-1: none that is an integer, e.g. weights from disk)."""
    return int(reported) if str(reported).lstrip("-").isdigit() else -1


def _version(choice: dict) -> int:
    """The oldest weight version among the sample's spans (one span unless weights changed mid-sample)."""
    numbers = [version_number(span["version"]) for span in choice.get("weight_versions") or []]
    return min(numbers) if numbers else -1
