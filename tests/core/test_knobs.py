"""GRPOLoss knobs: the values a controller (EntropyController) may move during training."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from lightning_grpo.core import GRPOLoss, LossTerms


def test_knobs_are_entropy_coef_and_the_policy_loss_numeric_arguments():
    assert GRPOLoss().knobs() == ("entropy_coef", "eps_low", "eps_high")
    assert GRPOLoss(policy_loss="clip_cov").knobs() == (
        "entropy_coef",
        "eps_low",
        "eps_high",
        "clip_ratio",
        "clip_cov_lb",
        "clip_cov_ub",
    )
    assert GRPOLoss(policy_loss="kl_cov").knobs() == ("entropy_coef", "kl_cov_ratio", "ppo_kl_coef")


def test_knob_reads_the_configured_value_or_the_loss_default():
    loss = GRPOLoss(policy_loss_args={"eps_high": 0.28}, terms=LossTerms(entropy_coef=0.01))
    assert (loss.knob("eps_high"), loss.knob("eps_low"), loss.knob("entropy_coef")) == (0.28, 0.2, 0.01)
    assert GRPOLoss(policy_loss="kl_cov").knob("kl_cov_ratio") == 2e-4


def test_set_knob_changes_the_next_loss_value():
    """entropy_coef 0 -> 0.5 adds -0.5 * mean H; eps_high 0.2 -> 0.5 unclips a ratio of 1.4."""
    logp = torch.tensor([[-1.0, -1.0]])
    old = logp - torch.tensor([[0.0, torch.log(torch.tensor(1.4)).item()]])  # ratios 1, 1.4
    mask, adv, entropy = torch.ones(1, 2), torch.tensor([1.0]), torch.tensor([[2.0, 1.0]])
    loss = GRPOLoss()
    before = loss(logp, mask, adv, old_logp=old, entropy=entropy).loss
    assert_close(before, torch.tensor(-(1.0 + 1.2) / 2))  # the 1.4 ratio is clipped at 1.2
    loss.set_knob("eps_high", 0.5)
    loss.set_knob("entropy_coef", 0.5)
    after = loss(logp, mask, adv, old_logp=old, entropy=entropy).loss
    assert_close(after, torch.tensor(-(1.0 + 1.4) / 2 - 0.5 * 1.5))
    assert loss.knob("eps_high") == 0.5 and loss.terms.entropy_coef == 0.5


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (
            "clip_ratio",
            0.1,
            r"GRPOLoss has no knob 'clip_ratio' with this policy loss; available: entropy_coef, eps_low, eps_high",
        ),
        ("eps_high", -0.1, r"GRPOLoss knob eps_high must be finite and >= 0, got -0.1"),
        ("entropy_coef", float("nan"), r"GRPOLoss knob entropy_coef must be finite and >= 0, got nan"),
    ],
)
def test_bad_knobs_are_refused(name, value, message):
    with pytest.raises(ValueError, match=message):
        GRPOLoss().set_knob(name, value)
