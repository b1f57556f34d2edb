"""What a registered variant can do and needs, declared with it: one small frozen spec per registry kind.

A variant is registered with its spec (``@ADVANTAGES.register("opo", spec=AdvantageSpec(needs_lengths=True))``)
and the code that uses it reads the spec's fields as plain attributes (``ADVANTAGES.spec("opo").needs_lengths``).
A misspelt field is a ``TypeError`` when the spec is built, a wrong value a ``ValueError`` naming the field;
a variant registered without a spec gets its kind's defaults. Kinds with nothing to declare use `NoSpec`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from torch import Tensor

Level = Literal["token", "sequence"]


def _check_choice(spec: object, field: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{type(spec).__name__}.{field} must be one of {', '.join(choices)}; got {value!r}")


def _check_bools(spec: object, *fields: str) -> None:
    for field in fields:
        value = getattr(spec, field)
        if not isinstance(value, bool):
            raise TypeError(f"{type(spec).__name__}.{field} must be a bool, got {type(value).__name__} {value!r}")


@dataclass(frozen=True)
class NoSpec:
    """The spec of a kind whose variants declare nothing (aggregations, KL estimators, rejections, ...)."""


@dataclass(frozen=True)
class AdvantageSpec:
    """What an advantage estimator (an ``ADVANTAGES`` entry) compares and needs."""

    group_relative: bool = False
    """It compares each completion with the others of its prompt: a group of one gives no signal
    (the run plan's checks then ask for ``rollout.sampling.n >= 2``)."""
    divides_by_group_std: bool = False
    """It divides by the group's reward std (needs ``group_relative``); named in that check's error."""
    takes_scored: bool = False
    """It takes ``scored`` [B] bool and leaves unscored rows out of its group statistics
    (``model.algorithm.unscored: exclude`` needs it)."""
    needs_lengths: bool = False
    """It takes ``lengths`` [B] (completion tokens per row); the trainer passes them (opo)."""

    def __post_init__(self) -> None:
        _check_bools(self, "group_relative", "divides_by_group_std", "takes_scored", "needs_lengths")
        if self.divides_by_group_std and not self.group_relative:
            raise ValueError("AdvantageSpec.divides_by_group_std needs group_relative=True (a group std is a group's)")


@dataclass(frozen=True)
class PolicyLossSpec:
    """How a policy loss (a ``POLICY_LOSSES`` entry) aggregates and weights its tokens."""

    default_aggregation: str = "token_mean"
    """The ``AGGREGATIONS`` name `GRPOLoss` uses when none is named (sapo: seq_mean_token_mean)."""
    required_aggregation: str | None = None
    """The only ``AGGREGATIONS`` name the loss accepts (geo_mean aggregates per sequence itself); None: any."""
    sequence_is_weight: Callable[[Tensor, Tensor], Tensor] | None = None
    """(token IS weight [B, T], loss mask [B, T]) -> [B, T], one weight per row on its valid tokens: a
    correction's token weights become one per sequence (geo_mean: their geometric mean); None: per token."""

    def __post_init__(self) -> None:
        for field in ("default_aggregation", "required_aggregation"):
            value = getattr(self, field)
            if not (value is None and field == "required_aggregation") and not (isinstance(value, str) and value):
                raise TypeError(f"PolicyLossSpec.{field} must be an aggregation name, got {value!r}")
        if self.sequence_is_weight is not None and not callable(self.sequence_is_weight):
            raise TypeError(f"PolicyLossSpec.sequence_is_weight must be callable, got {self.sequence_is_weight!r}")


@dataclass(frozen=True)
class CorrectionSpec:
    """The level a rollout correction's (a ``CORRECTIONS`` entry's) weight lives at."""

    level: Level = "token"
    """``token``: one weight per token; ``sequence``: one per row (batch normalisation then averages rows)."""

    def __post_init__(self) -> None:
        _check_choice(self, "level", self.level, ("token", "sequence"))


@dataclass(frozen=True)
class LogProbSpec:
    """What a log-prob path (a ``LOGPROBS`` entry) scores."""

    reads: Literal["logits", "hidden"]
    """``logits``: the model's logits [..., V]; ``hidden``: final hidden states [..., H] and the LM head (weight,
    bias), so the trainer calls the decoder and the head apart (and the full logits never exist)."""

    def __post_init__(self) -> None:
        _check_choice(self, "reads", self.reads, ("logits", "hidden"))
