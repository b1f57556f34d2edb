"""Named registries of algorithm variants.

Every variant of the GRPO family (an advantage estimator, a policy loss, an aggregation mode, a
KL estimator, a correction, ...) is a small function registered under a unique name. Code
elsewhere looks variants up by name here and never branches on the name itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """A name -> callable table for one kind of variant (e.g. ``"advantage"``).

    ``register`` is a decorator that rejects duplicate names; ``get`` raises a ``ValueError``
    that names the kind and lists the valid names when a name is unknown.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._table: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} registry: a variant name must be a non-empty string")

        def decorator(fn: F) -> F:
            if name in self._table:
                raise ValueError(f"{self.kind} '{name}' is already registered")
            self._table[name] = fn
            return fn

        return decorator

    def get(self, name: str) -> F:
        try:
            return self._table[name]
        except (KeyError, TypeError):
            valid = ", ".join(sorted(self._table))
            raise ValueError(f"unknown {self.kind} {name!r}; valid names: {valid}") from None

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


ADVANTAGES: Registry = Registry("advantage estimator")
REWARD_AGGREGATIONS: Registry = Registry("multi-reward aggregation")
POLICY_LOSSES: Registry = Registry("policy loss")
AGGREGATIONS: Registry = Registry("loss aggregation")
KL_ESTIMATORS: Registry = Registry("KL estimator")
KL_CONTROLLERS: Registry = Registry("KL controller")
CORRECTIONS: Registry = Registry("rollout correction")
REJECTIONS: Registry = Registry("rollout rejection criterion")
TOKEN_TERMS: Registry = Registry("token loss term")
TOKEN_MASKS: Registry = Registry("token mask")
SELECTIONS: Registry = Registry("sample selection")
LOGPROBS: Registry = Registry("log-prob path")

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
