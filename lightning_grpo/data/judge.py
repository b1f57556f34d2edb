"""``llm_judge``: a reward scored by an LLM behind any OpenAI-compatible endpoint (vLLM, SGLang, ...).

For each completion the judge fills ``template`` with the completion and the row's columns
(``{prompt}``, ``{answer}``, any other column), POSTs it to ``{base_url}/chat/completions`` (or
``/completions``), and parses the score from the reply: the last match of ``score_pattern`` (by
default the last number in the reply; a pattern with a group reads group 1). Requests run
concurrently (``max_concurrency``), each with a ``timeout_s`` and ``retries`` with exponential
backoff.

Failure policy, stated once:

- An outage (connection refused or reset, no answer within ``timeout_s``, HTTP 408 / 429 / 5xx, a
  body that is not a completion) is retried, and so is a reply without a score when the judge
  samples (``temperature > 0``; a greedy reply would repeat itself); after the last attempt
  ``on_failure: raise`` stops training with one :class:`JudgeError` that names the URL, what
  failed and the sample, and ``on_failure: <number>`` scores the row with that number and counts it
  (``reward/<name>/judge_failures``; retries in ``reward/<name>/judge_retries``, both totals since
  the start, per rank).
- Any other HTTP error (400 a bad request, 401 no key, 404 an unknown model) is a configuration
  error and always raises, whatever ``on_failure`` says.

Standard library only (``urllib`` in a thread pool): no client package to install. Under DDP every
rank sends its own rows.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import re
import socket
import string
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, NamedTuple

from lightning_grpo.data.judge_settings import JudgeRequests, JudgeSampling, as_group
from lightning_grpo.data.options import (
    check_bool,
    check_choice,
    fail,
    is_number,
    prompt_column,
)
from lightning_grpo.data.registry import REWARDS, RewardError

#: The default ``template``: the question, the reference answer and the response, scored 0-10.
DEFAULT_TEMPLATE = (
    "Rate the response to the question from 0 (wrong) to 10 (correct and complete).\n"
    "Question: {prompt}\nReference answer: {answer}\nResponse: {completion}\n"
    "Reply with the score only."
)
#: The default ``score_pattern``: a number, optionally signed, with an optional decimal part.
NUMBER = r"-?\d+(?:\.\d+)?"
_RETRY_STATUS = {408, 429}


class JudgeError(RewardError):
    """The judge failed on a sample (after its retries), or answered a request with a client error."""


class Endpoint(NamedTuple):
    """One OpenAI-compatible endpoint: its path under ``base_url``, the request body of a filled-in
    template (and system message), and where the reply text sits in the answer's first choice."""

    path: str
    body: Callable[[str, str | None], dict[str, Any]]
    reply: Callable[[dict[str, Any]], Any]
    reply_field: str


def _chat_body(text: str, system: str | None) -> dict[str, Any]:
    system_messages = [{"role": "system", "content": system}] if system is not None else []
    return {"messages": [*system_messages, {"role": "user", "content": text}]}


#: ``endpoint``: ``"chat"`` (the server applies the judge's chat template) or ``"completions"`` (raw text).
ENDPOINTS = {
    "chat": Endpoint(
        "chat/completions", _chat_body, lambda choice: choice["message"]["content"], "choices[0].message.content"
    ),
    "completions": Endpoint(
        "completions", lambda text, system: {"prompt": text}, lambda choice: choice["text"], "choices[0].text"
    ),
}


class _Transient(Exception):
    """A failure worth retrying (outage, server error, a reply without a score)."""


def template_fields(template: Any) -> list[str]:
    """The ``{field}`` names of ``template`` (ValueError naming ``kwargs.template`` if it is not a
    format string of plain names that includes ``{completion}``)."""
    if not isinstance(template, str):
        fail("template", "a string with {completion} and column fields such as {prompt}", template)
    try:
        fields = [f for _, f, spec, conv in string.Formatter().parse(template) if f is not None]
    except ValueError as err:
        raise ValueError(f"kwargs.template is not a valid format string: {err}") from None
    bad = [f for f in fields if not f.isidentifier()]
    if bad:
        raise ValueError(f"kwargs.template fields must be plain column names like {{prompt}}, got {bad}")
    if "completion" not in fields:
        raise ValueError("kwargs.template must contain {completion} (the text being judged)")
    return sorted(set(fields))


def render_value(value: Any) -> str:
    """A column value as template text: chat messages become ``role: content`` lines."""
    if isinstance(value, list) and all(isinstance(m, dict) and "content" in m for m in value):
        return "\n".join(f"{m.get('role', 'user')}: {m['content']}" for m in value)
    return str(value)


def parse_score(reply: str, pattern: re.Pattern) -> float | None:
    """The last match of ``pattern`` in ``reply`` (group 1 if it has a group) as a float, else None."""
    matches = list(pattern.finditer(reply))
    if not matches:
        return None
    text = matches[-1].group(1 if pattern.groups else 0)
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _compile(score_pattern: Any) -> re.Pattern:
    if not isinstance(score_pattern, str):
        fail("score_pattern", "a regex string", score_pattern)
    try:
        pattern = re.compile(score_pattern, re.DOTALL)
    except re.error as err:
        raise ValueError(f"kwargs.score_pattern {score_pattern!r} is not a valid regex: {err}") from None
    if pattern.groups > 1:
        fail("score_pattern", "a regex with at most one group (the score)", score_pattern)
    return pattern


def _check_clamp(clamp: Any, normalize: Any) -> tuple[float, float] | None:
    check_bool("normalize", normalize)
    if clamp is None:
        if normalize:
            raise ValueError("kwargs.normalize needs kwargs.clamp (the range mapped onto [0, 1])")
        return None
    if (
        not isinstance(clamp, (list, tuple))
        or len(clamp) != 2
        or not all(map(is_number, clamp))
        or not clamp[0] < clamp[1]
    ):
        fail("clamp", "[low, high] with finite low < high", clamp)
    return float(clamp[0]), float(clamp[1])


@REWARDS.register("llm_judge")
class LLMJudge:
    """An LLM judge as a reward (options are the ``kwargs`` of its ``RewardSpec``; see the module doc).

    Args:
        base_url: the endpoint's API root, e.g. ``http://127.0.0.1:8000/v1``.
        model: the served model name (vLLM: ``--served-model-name``, else the model path).
        template: the user message: ``{completion}`` plus any columns (``{answer}``, ...);
            ``{prompt}`` is the prompt as the data holds it (``raw_prompt`` when the records carry
            it, chat messages written as ``role: content`` lines), not the policy's chat-templated text.
        system: an optional system message (chat endpoint only).
        endpoint: ``"chat"`` (``/chat/completions``, the server applies the judge's chat template)
            or ``"completions"`` (``/completions``, the template is sent as raw text).
        score_pattern: regex whose last match in the reply is the score (group 1 if it has a group),
            e.g. ``"<score>(.*?)</score>"``; default: the last number.
        clamp: ``[low, high]``: scores are clipped into this range.
        normalize: map ``clamp``'s range onto [0, 1] (needs ``clamp``).
        requests: concurrency, timeout, retries and backoff, and what a failed row gets (`JudgeRequests`,
            or a mapping of its fields: ``{timeout_s: 30, on_failure: 0.0}``).
        sampling: temperature, max_tokens, seed and extra request fields of each request (`JudgeSampling`,
            or a mapping of its fields).
        api_key_env: name of an environment variable holding a bearer token (keys stay out of recipes).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        template: str = DEFAULT_TEMPLATE,
        system: str | None = None,
        endpoint: Literal["chat", "completions"] = "chat",
        score_pattern: str = NUMBER,
        clamp: Sequence[float] | None = None,
        normalize: bool = False,
        requests: JudgeRequests | dict[str, Any] = JudgeRequests(),  # noqa: B008 - frozen settings, never mutated
        sampling: JudgeSampling | dict[str, Any] = JudgeSampling(),  # noqa: B008 - frozen settings, never mutated
        api_key_env: str | None = None,
    ) -> None:
        if not isinstance(base_url, str) or not re.match(r"https?://[^/]", base_url):
            fail("base_url", "an http(s) URL such as 'http://127.0.0.1:8000/v1'", base_url)
        if not isinstance(model, str) or not model:
            fail("model", "the served model name (a non-empty string)", model)
        self.fields = template_fields(template)
        check_choice("endpoint", endpoint, list(ENDPOINTS))
        if system is not None and (not isinstance(system, str) or endpoint != "chat"):
            fail("system", "a string (with endpoint 'chat': a completions request has no messages) or null", system)
        self.url = f"{base_url.rstrip('/')}/{ENDPOINTS[endpoint].path}"
        self.pattern = _compile(score_pattern)
        self.clamp = _check_clamp(clamp, normalize)
        send, sample = as_group(JudgeRequests, requests, "requests"), as_group(JudgeSampling, sampling, "sampling")
        self.headers = {"Content-Type": "application/json"}
        if api_key_env is not None:
            if not isinstance(api_key_env, str) or not os.environ.get(api_key_env):
                fail("api_key_env", "the name of a set environment variable holding the API key", api_key_env)
            self.headers["Authorization"] = f"Bearer {os.environ[api_key_env]}"
        self.template, self.system, self.endpoint, self.model = template, system, endpoint, model
        self.normalize, self.max_concurrency, self.timeout_s = normalize, send.max_concurrency, float(send.timeout_s)
        self.retries, self.backoff_s, self.on_failure = send.retries, float(send.backoff_s), send.on_failure
        self.sampling = {
            "temperature": sample.temperature,
            "max_tokens": sample.max_tokens,
            **({"seed": sample.seed} if sample.seed is not None else {}),
        }
        self.extra_body = dict(sample.extra_body or {})
        self.failures = 0  # rows scored with on_failure's value, since construction
        self.retried = 0  # extra attempts made, since construction
        self._lock = threading.Lock()

    # ------------------------------------------------------------------- scoring
    def request(self, text: str) -> dict[str, Any]:
        """The JSON body sent for one filled-in template."""
        body = ENDPOINTS[self.endpoint].body(text, self.system)
        return {"model": self.model, **body, **self.sampling, **self.extra_body}

    def __call__(self, completions: list[str], **columns: Any) -> list[float]:
        sources = {f: prompt_column(columns, None) if f == "prompt" else f for f in self.fields if f != "completion"}
        missing = [f for f, column in sources.items() if column not in columns]
        if missing:
            raise JudgeError(f"judge template fields {missing} are not columns of the data; columns: {sorted(columns)}")
        texts = [
            self.template.format(completion=c, **{f: render_value(columns[column][i]) for f, column in sources.items()})
            for i, c in enumerate(completions)
        ]
        if not texts:
            return []
        workers = min(self.max_concurrency, len(texts))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="llm-judge") as pool:
            outcomes = list(pool.map(self._judge, texts))  # [B] (score or None, why it failed)
        scores = []
        for i, (score, reason) in enumerate(outcomes):
            if score is None and self.on_failure == "raise":
                raise JudgeError(
                    f"judge at {self.url} failed on sample {i} (completion {completions[i][:40]!r}) {reason} "
                    "(on_failure='raise'; set a number to score it instead)"
                )
            scores.append(self._scale(score) if score is not None else float(self.on_failure))
        return scores

    def _scale(self, score: float) -> float:
        if self.clamp is None:
            return score
        low, high = self.clamp
        score = min(max(score, low), high)
        return (score - low) / (high - low) if self.normalize else score

    def _judge(self, text: str) -> tuple[float | None, str]:
        """(score, "") or (None, after how many attempts and why the last one failed); a reply without
        a score is retried only when sampling (``temperature > 0``): a greedy reply repeats itself.
        Client errors raise JudgeError."""
        attempts = 0
        while True:
            if attempts:
                with self._lock:
                    self.retried += 1
                time.sleep(self.backoff_s * 2 ** (attempts - 1))
            attempts += 1
            try:
                reply = self._reply(self._post(self.request(text)))
                score = parse_score(reply, self.pattern)
                if score is not None:
                    return score, ""
                reason = f"no score matching score_pattern '{self.pattern.pattern}' in the reply {reply[:80]!r}"
                retry = self.sampling["temperature"] > 0
            except _Transient as err:
                reason, retry = str(err), True
            if not retry or attempts > self.retries:
                with self._lock:
                    self.failures += 1
                return None, f"after {attempts} attempt{'s' if attempts > 1 else ''}: {reason}"

    def _post(self, body: dict[str, Any]) -> Any:
        request = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=self.headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                payload = response.read()
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")[:300]
            if err.code in _RETRY_STATUS or err.code >= 500:
                raise _Transient(f"HTTP {err.code}: {detail}") from None
            raise JudgeError(
                f"judge at {self.url} answered HTTP {err.code} (a bad request, not retried): {detail}"
            ) from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as err:
            reason = getattr(err, "reason", err)  # a urllib error (standard library)
            if isinstance(reason, (socket.timeout, TimeoutError)):
                raise _Transient(f"no answer within timeout_s={self.timeout_s}") from None
            raise _Transient(f"cannot connect: {reason}") from None
        try:
            return json.loads(payload)
        except ValueError:
            raise _Transient(f"the answer is not JSON: {payload[:80]!r}") from None

    def _reply(self, answer: Any) -> str:
        endpoint = ENDPOINTS[self.endpoint]
        try:
            reply = endpoint.reply(answer["choices"][0])
        except (KeyError, IndexError, TypeError):
            raise _Transient(f"the answer has no {endpoint.reply_field}: {str(answer)[:80]}") from None
        return reply if isinstance(reply, str) else ""

    def totals(self) -> dict[str, float]:
        """Running counters logged as ``reward/<name>/<key>``."""
        return {"judge_failures": float(self.failures), "judge_retries": float(self.retried)}

    def __getstate__(self) -> dict[str, Any]:  # picklable (ddp_spawn): the lock is rebuilt
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.Lock())
