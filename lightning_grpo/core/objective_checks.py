"""The build-time checks of `GRPOLoss`'s settings: each bad value is one error naming its field."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from .registry import Variant


def resolve_aggregation(policy_loss: Variant, aggregation: str | None) -> str:
    """The aggregation to use: the one named, else the one the loss's spec requires, else its default
    (token_mean unless the spec says otherwise); a loss that requires one (geo_mean) refuses any other."""
    required = policy_loss.spec.required_aggregation
    if required is not None and aggregation not in (None, required):
        raise ValueError(
            f"GRPOLoss policy_loss {policy_loss.name!r} aggregates per sequence itself and needs aggregation "
            f"{required!r} (or none named), got {aggregation!r}"
        )
    return aggregation or required or policy_loss.spec.default_aggregation


def check_loss_args(policy_loss: str, fn, args: dict[str, Any]) -> None:
    """policy_loss_args are keyword arguments of the loss: unknown and missing required ones fail now."""
    params = {
        p.name: p
        for p in inspect.signature(fn).parameters.values()
        if p.kind is p.KEYWORD_ONLY and p.name != "generator"
    }
    unknown = sorted(set(args) - set(params))
    if unknown:
        raise ValueError(
            f"GRPOLoss policy_loss_args {unknown} are not parameters of policy loss {policy_loss!r}; it takes {sorted(params)}"
        )
    missing = [n for n, p in params.items() if p.default is p.empty and n not in args]
    if missing:
        raise ValueError(f"GRPOLoss policy loss {policy_loss!r} needs policy_loss_args {missing} (no default)")


def check_type(field: str, value: Any, expected: type) -> None:
    if not isinstance(value, expected):
        raise TypeError(f"GRPOLoss {field} must be a {expected.__name__}, got {type(value).__name__} {value!r}")


def in_field(field: str, build: Callable[[Any], Any], value: Any) -> Any:
    """``build(value)``, a ValueError prefixed with the settings field (``off_policy.correction: unknown ...``)."""
    try:
        return build(value)
    except ValueError as err:
        raise ValueError(f"{field}: {err}") from None
