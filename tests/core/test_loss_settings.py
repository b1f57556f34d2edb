"""GRPOLoss's grouped settings (KLSettings, OffPolicySettings, LossTerms) and its typed capability properties."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

import lightning_grpo
from lightning_grpo.core import GRPOLoss, KLSettings, LossTerms, OffPolicySettings


def test_constructor_groups_and_exports():
    params = list(inspect.signature(GRPOLoss).parameters)
    assert params == ["policy_loss", "policy_loss_args", "aggregation", "aggregation_args", "kl", "off_policy", "terms"]
    assert lightning_grpo.KLSettings is KLSettings and lightning_grpo.OffPolicySettings is OffPolicySettings
    assert lightning_grpo.LossTerms is LossTerms
    assert {f.name for f in dataclasses.fields(OffPolicySettings)} == {
        "correction",
        "correction_args",
        "is_batch_normalize",
        "rejection",
        "bypass",
        "sequence_mask_delta",
    }


def test_every_field_has_a_docstring():
    """The attribute docstrings are what LightningCLI --help / --print_config show."""
    import ast

    from lightning_grpo.core import settings

    tree = ast.parse(inspect.getsource(settings))
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            body = node.body
            for i, stmt in enumerate(body):
                if isinstance(stmt, ast.AnnAssign):
                    follow = body[i + 1] if i + 1 < len(body) else None
                    assert isinstance(follow, ast.Expr) and isinstance(follow.value, ast.Constant), (
                        node.name,
                        stmt.target.id,
                    )


def test_capabilities_follow_the_settings():
    plain = GRPOLoss()
    assert (plain.beta, plain.correction, plain.bypass) == (0.0, None, False)
    assert not (plain.needs_reference or plain.needs_rollout_logprobs or plain.masks_before_training)
    assert not (plain.needs_old_before_training or plain.normalizes_is_weights)
    assert GRPOLoss(kl=KLSettings(beta=0.04)).needs_reference and GRPOLoss(kl=KLSettings(beta=0.04)).beta == 0.04
    assert GRPOLoss(off_policy=OffPolicySettings(sequence_mask_delta=0.1)).needs_rollout_logprobs
    rejecting = GRPOLoss(off_policy=OffPolicySettings(rejection={"token_k1": 2.0}))
    assert rejecting.masks_before_training and rejecting.needs_old_before_training and rejecting.needs_rollout_logprobs
    normalising = GRPOLoss(off_policy=OffPolicySettings(correction="tis_token", is_batch_normalize=True))
    assert (
        normalising.correction == "tis_token"
        and normalising.normalizes_is_weights
        and normalising.needs_old_before_training
    )
    assert not GRPOLoss(off_policy=OffPolicySettings(is_batch_normalize=True)).normalizes_is_weights  # no correction
    bypass = GRPOLoss(off_policy=OffPolicySettings(bypass=True))
    assert bypass.bypass and bypass.needs_rollout_logprobs and not bypass.needs_old_before_training


def test_set_correction_reports_its_name_and_changes_the_numbers():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    mask, adv = torch.ones(1, 2), torch.tensor([1.0])
    roll = logp.detach() - torch.tensor([[0.0, torch.log(torch.tensor(4.0)).item()]])  # ratio 4 on token 1
    loss = GRPOLoss()
    assert loss(logp, mask, adv, rollout_logp=roll).loss.item() == pytest.approx(-1.0)
    loss.set_correction("tis_token", {"cap": 2.0})
    assert loss.correction == "tis_token" and loss.off_policy.correction_args == {"cap": 2.0}
    assert loss.needs_rollout_logprobs
    assert loss(logp, mask, adv, rollout_logp=roll).loss.item() == pytest.approx(-1.5)  # weights 1 and 2
    loss.set_correction(None)
    assert loss.correction is None and not loss.needs_rollout_logprobs


def test_knobs_move_the_loss_not_the_settings_object():
    terms = LossTerms(entropy_coef=0.01)
    a, b = GRPOLoss(terms=terms), GRPOLoss()
    a.set_knob("entropy_coef", 0.5)
    b.set_knob("entropy_coef", 0.2)
    assert (a.terms.entropy_coef, a.knob("entropy_coef"), terms.entropy_coef) == (0.5, 0.5, 0.01)
    assert (b.terms.entropy_coef, GRPOLoss().terms.entropy_coef, LossTerms().entropy_coef) == (0.2, 0.0, 0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.terms.entropy_coef = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: KLSettings(beta=-0.1), r"kl.beta must be a finite number >= 0 \(0 = no KL term\), got -0.1"),
        (lambda: KLSettings(beta=float("nan")), r"kl.beta must be a finite number >= 0"),
        (lambda: LossTerms(top_entropy_quantile=1.0), r"terms.top_entropy_quantile must be in \[0, 1\) .* got 1.0"),
        (
            lambda: OffPolicySettings(bypass=True, correction="mis_seq"),
            r"off_policy.correction must be None, got 'mis_seq'",
        ),
        (lambda: GRPOLoss(kl=KLSettings(estimator="k9")), r"^kl.estimator: unknown KL estimator 'k9'; valid names: k1"),
        (
            lambda: GRPOLoss(off_policy=OffPolicySettings(correction="tis")),
            r"^off_policy.correction: unknown rollout correction 'tis'",
        ),
        (
            lambda: GRPOLoss(off_policy=OffPolicySettings(rejection={"token_k9": 1.0})),
            r"^off_policy.rejection: unknown rollout rejection criterion 'token_k9'",
        ),
        (
            lambda: GRPOLoss(off_policy=OffPolicySettings(rejection={"token_k1": -1.0})),
            r"^off_policy.rejection: rejection 'token_k1': a threshold must be a number > 0, got -1.0",
        ),
    ],
    ids=[
        "beta",
        "beta_nan",
        "top_entropy_quantile",
        "bypass_correction",
        "estimator",
        "correction",
        "rejection",
        "threshold",
    ],
)
def test_bad_settings_name_the_field(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_a_dict_for_a_group_is_refused_naming_it():
    with pytest.raises(TypeError, match=r"GRPOLoss kl must be a KLSettings, got dict"):
        GRPOLoss(kl={"beta": 0.04})  # type: ignore[arg-type]
