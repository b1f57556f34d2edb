"""The settings groups of `LLMJudge`: how requests are sent and retried, and how the judge samples.

In a recipe they are mappings under the reward's ``kwargs``
(``kwargs: {base_url: ..., model: ..., requests: {timeout_s: 30}, sampling: {max_tokens: 16}}``); each field is
checked when the group is built, and an error names it as ``kwargs.requests.timeout_s``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

from lightning_grpo.data.options import check_int, check_number, fail, is_int, is_number


@dataclass(frozen=True)
class JudgeRequests:
    """How `LLMJudge` sends its requests and what a failed row gets."""

    max_concurrency: int = 8
    """Requests in flight at once (per rank)."""
    timeout_s: float = 60.0
    """Seconds one request may wait for the connection or for each read."""
    retries: int = 2
    """Further attempts after a failed one (a sampled judge's unparsable reply too)."""
    backoff_s: float = 0.5
    """``backoff_s * 2**k`` seconds before retry k."""
    on_failure: Literal["raise"] | float = "raise"
    """``"raise"``, or the reward given to a row the judge failed on (counted in ``judge_failures``)."""

    def __post_init__(self) -> None:
        check_int("requests.max_concurrency", self.max_concurrency, 1)
        check_number("requests.timeout_s", self.timeout_s, 0, strict=True, unit=" (seconds)")
        check_int("requests.retries", self.retries, 0)
        check_number("requests.backoff_s", self.backoff_s, 0, unit=" (seconds)")
        if self.on_failure != "raise" and not is_number(self.on_failure):
            fail("requests.on_failure", "'raise' or a finite number (the reward of a failed row)", self.on_failure)


@dataclass(frozen=True)
class JudgeSampling:
    """The sampling parameters of each judge request."""

    temperature: float = 0.0
    """Sampling temperature (0: greedy; above 0 an unparsable reply is retried)."""
    max_tokens: int = 512
    """Longest reply in tokens."""
    seed: int | None = None
    """Seed sent with each request (None: none sent)."""
    extra_body: dict[str, Any] | None = None
    """More request fields, e.g. ``{"structured_outputs": {"regex": "[0-9]"}}`` (vLLM)."""

    def __post_init__(self) -> None:
        check_number("sampling.temperature", self.temperature, 0)
        check_int("sampling.max_tokens", self.max_tokens, 1)
        if self.seed is not None and not is_int(self.seed):
            fail("sampling.seed", "an integer or null", self.seed)
        if self.extra_body is not None and not isinstance(self.extra_body, dict):
            fail("sampling.extra_body", "a mapping of extra request fields", self.extra_body)


def as_group(cls: type, value: Any, option: str) -> Any:
    """``value`` as a ``cls``: an instance as is, a mapping of its fields (a recipe's) built into one."""
    if isinstance(value, cls):
        return value
    if not isinstance(value, dict):
        fail(option, f"a {cls.__name__} or a mapping of its fields", value)
    names = [f.name for f in fields(cls)]
    unknown = sorted(set(value) - set(names))
    if unknown:
        raise ValueError(f"unknown kwargs.{option} fields {unknown}; its fields are {names}")
    return cls(**value)
