"""Each registry entry carries a frozen typed spec of what the variant can do and needs: a misspelt
capability fails when the spec is built, a spec of another kind when it is registered."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lightning_grpo.core import (
    ADVANTAGES,
    CORRECTIONS,
    LOGPROBS,
    POLICY_LOSSES,
    REGISTRIES,
    AdvantageSpec,
    CorrectionSpec,
    GRPOLoss,
    LogProbSpec,
    NoSpec,
    OffPolicySettings,
    PolicyLossSpec,
    Registry,
)


def test_a_misspelt_capability_is_an_error_not_a_default():
    with pytest.raises(TypeError, match="needs_length"):
        AdvantageSpec(needs_length=True)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match=r"CorrectionSpec.level must be one of token, sequence; got 'sequnce'"):
        CorrectionSpec(level="sequnce")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"LogProbSpec.reads must be one of logits, hidden; got 'hiden'"):
        LogProbSpec(reads="hiden")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"AdvantageSpec.takes_scored must be a bool, got str 'yes'"):
        AdvantageSpec(takes_scored="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="divides_by_group_std needs group_relative=True"):
        AdvantageSpec(divides_by_group_std=True)
    with pytest.raises(TypeError, match=r"PolicyLossSpec.default_aggregation must be an aggregation name"):
        PolicyLossSpec(default_aggregation="")


def test_specs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ADVANTAGES.spec("grpo").takes_scored = False  # type: ignore[misc]


def test_registering_checks_the_spec_type_and_required_fields():
    paths = Registry("log-prob path", LogProbSpec)
    with pytest.raises(TypeError, match=r"log-prob path 'x' needs spec=LogProbSpec\(\.\.\.\)"):
        paths.register("x")
    with pytest.raises(TypeError, match=r"log-prob path 'x': spec must be a LogProbSpec, got CorrectionSpec"):
        paths.register("x", spec=CorrectionSpec())
    fn = paths.register("x", spec=LogProbSpec(reads="hidden"))(lambda *a: None)
    variant = paths.variant("x")
    assert (variant.name, variant.fn, variant.spec.reads) == ("x", fn, "hidden") and paths.get("x") is fn
    plain = Registry("thing")
    plain.register("y")(len)
    assert plain.spec("y") == NoSpec()
    with pytest.raises(ValueError, match=r"unknown thing 'z'; valid names: y"):
        plain.spec("z")


def test_every_entry_carries_its_kinds_spec():
    for kind, registry in REGISTRIES.items():
        for name in registry.names():
            assert type(registry.spec(name)) is registry.spec_type, f"{kind}:{name}"


def _builtin(registry: Registry) -> list[str]:
    """The package's own entries (a docs example may have registered one of its own in this process)."""
    return [n for n in registry.names() if registry.get(n).__module__.startswith("lightning_grpo.core.")]


def test_the_declared_capabilities():
    estimators = _builtin(ADVANTAGES)
    assert len(estimators) == 10 and all(ADVANTAGES.spec(n).group_relative for n in estimators)
    assert {n for n in estimators if ADVANTAGES.spec(n).divides_by_group_std} == {"grpo", "passk"}
    assert {n for n in estimators if ADVANTAGES.spec(n).needs_lengths} == {"opo"}
    assert all(ADVANTAGES.spec(n).takes_scored for n in estimators)
    levels = {n: CORRECTIONS.spec(n).level for n in CORRECTIONS.names()}
    assert levels == {
        "tis_token": "token",
        "mis_token": "token",
        "tis_seq": "sequence",
        "tis_seq_geo": "sequence",
        "mis_seq": "sequence",
    }
    assert {n: LOGPROBS.spec(n).reads for n in LOGPROBS.names()} == {"logits": "logits", "chunked_hidden": "hidden"}
    own = {n: POLICY_LOSSES.spec(n).default_aggregation for n in POLICY_LOSSES.names()}
    assert {n for n, a in own.items() if a != "token_mean"} == {"sapo"}
    assert [n for n in POLICY_LOSSES.names() if POLICY_LOSSES.spec(n).required_aggregation] == ["geo_mean"]
    assert GRPOLoss(policy_loss="sapo").aggregation == "seq_mean_token_mean"


def test_a_sequence_level_correction_normalises_over_rows():
    """tis_seq's spec says sequence: the batch mean averages rows, not tokens (2 rows: 1 token vs 3)."""
    old = torch.zeros(2, 3)
    roll = torch.tensor([[-0.5, 0.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    sums = {
        name: GRPOLoss(off_policy=OffPolicySettings(correction=name, is_batch_normalize=True)).is_weight_sums(
            old, roll, mask
        )
        for name in ("tis_token", "tis_seq")
    }
    w = torch.tensor(0.5).exp()  # row 0's (capped-at-2) weight exp(old - roll)
    torch.testing.assert_close(sums["tis_token"], torch.stack([w + 3, torch.tensor(4.0)]))
    torch.testing.assert_close(sums["tis_seq"], torch.stack([w + 1, torch.tensor(2.0)]))
