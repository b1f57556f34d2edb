"""Named registries of algorithm variants.

Every variant of the GRPO family (an advantage estimator, a policy loss, an aggregation mode, a
KL estimator, a correction, ...) is a small function registered under a unique name, with a typed
spec of what it can do and needs (:mod:`.specs`). Code elsewhere looks variants up by name here,
reads their specs, and never branches on the name itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .specs import AdvantageSpec, CorrectionSpec, LogProbSpec, NoSpec, PolicyLossSpec

F = TypeVar("F", bound=Callable)
S = TypeVar("S")


@dataclass(frozen=True)
class Variant(Generic[F, S]):
    """One registry entry: its name, its function and the spec it was registered with."""

    name: str
    fn: F
    spec: S


class Registry(Generic[F, S]):
    """A name -> (callable, spec) table for one kind of variant (e.g. ``"advantage"``).

    ``register(name, spec=...)`` is a decorator that rejects duplicate names and a spec of another
    type than the kind's ``spec_type`` (no spec: the kind's defaults); ``get`` returns the function,
    ``spec`` its spec, ``variant`` both; each raises a ``ValueError`` that names the kind and lists
    the valid names when a name is unknown.
    """

    def __init__(self, kind: str, spec_type: type = NoSpec) -> None:
        self.kind = kind
        self.spec_type = spec_type
        self._table: dict[str, Variant[F, S]] = {}

    def register(self, name: str, spec: Any = None) -> Callable[[F], F]:
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} registry: a variant name must be a non-empty string")
        spec = self._spec_of(name, spec)

        def decorator(fn: F) -> F:
            if name in self._table:
                raise ValueError(f"{self.kind} '{name}' is already registered")
            self._table[name] = Variant(name, fn, spec)
            return fn

        return decorator

    def _spec_of(self, name: str, spec: Any) -> S:
        if spec is None:
            try:
                return self.spec_type()
            except TypeError:
                raise TypeError(
                    f"{self.kind} '{name}' needs spec={self.spec_type.__name__}(...) (its fields have no defaults)"
                ) from None
        if type(spec) is not self.spec_type:
            raise TypeError(
                f"{self.kind} '{name}': spec must be a {self.spec_type.__name__}, got {type(spec).__name__} {spec!r}"
            )
        return spec

    def variant(self, name: str) -> Variant[F, S]:
        try:
            return self._table[name]
        except (KeyError, TypeError):
            valid = ", ".join(sorted(self._table))
            raise ValueError(f"unknown {self.kind} {name!r}; valid names: {valid}") from None

    def get(self, name: str) -> F:
        return self.variant(name).fn

    def spec(self, name: str) -> S:
        return self.variant(name).spec

    def names(self) -> list[str]:
        return sorted(self._table)

    def __contains__(self, name: object) -> bool:
        return name in self._table

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._table))

    def __len__(self) -> int:
        return len(self._table)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"


ADVANTAGES: Registry = Registry("advantage estimator", AdvantageSpec)
REWARD_AGGREGATIONS: Registry = Registry("multi-reward aggregation")
POLICY_LOSSES: Registry = Registry("policy loss", PolicyLossSpec)
AGGREGATIONS: Registry = Registry("loss aggregation")
KL_ESTIMATORS: Registry = Registry("KL estimator")
KL_CONTROLLERS: Registry = Registry("KL controller")
CORRECTIONS: Registry = Registry("rollout correction", CorrectionSpec)
REJECTIONS: Registry = Registry("rollout rejection criterion")
TOKEN_TERMS: Registry = Registry("token loss term")
TOKEN_MASKS: Registry = Registry("token mask")
SELECTIONS: Registry = Registry("sample selection")
LOGPROBS: Registry = Registry("log-prob path", LogProbSpec)

#: Every registry by the name used in docs and error messages.
REGISTRIES: dict[str, Registry] = {
    "advantage": ADVANTAGES,
    "reward_aggregation": REWARD_AGGREGATIONS,
    "policy_loss": POLICY_LOSSES,
    "aggregation": AGGREGATIONS,
    "kl_estimator": KL_ESTIMATORS,
    "kl_controller": KL_CONTROLLERS,
    "correction": CORRECTIONS,
    "rejection": REJECTIONS,
    "token_term": TOKEN_TERMS,
    "token_mask": TOKEN_MASKS,
    "selection": SELECTIONS,
    "logprob": LOGPROBS,
}
