"""GRPOLoss: the composition of the named variants, checked against hand-computed values."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from torch.testing import assert_close

from lightning_grpo.core import REGISTRIES, GRPOLoss, KLSettings, LossTerms, NonFiniteError, OffPolicySettings

ATOL = dict(atol=1e-6, rtol=0)


def _batch():
    # 2 sequences: lengths 3 and 2; advantages +1 and -1
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, 0.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    return logp, mask, adv


def test_on_policy_token_mean_value_and_gradient():
    logp, mask, adv = _batch()
    out = GRPOLoss()(logp, mask, adv)
    # ratio = 1 everywhere: L_t = -A; token-mean over 5 tokens = -(3*1 + 2*(-1)) / 5 = -0.2
    assert_close(out.loss, torch.tensor(-0.2), **ATOL)
    out.loss.backward()
    # dL/dlogp_t = -A_t * ratio / N = -A_t / 5 on valid tokens
    assert_close(logp.grad, torch.tensor([[-0.2, -0.2, -0.2], [0.2, 0.2, 0.0]]), **ATOL)
    assert out.metrics["clip_frac_low"] == 0 and out.metrics["masked_frac"] == 0


def test_seq_mean_token_mean_and_global_normaliser():
    logp, mask, adv = _batch()
    out = GRPOLoss(aggregation="seq_mean_token_mean")(logp, mask, adv)
    # per sequence mean of -A: -1 and +1 -> mean over 2 sequences = 0
    assert_close(out.loss, torch.tensor(0.0), **ATOL)
    out = GRPOLoss()(logp, mask, adv, num_tokens=10.0)
    assert_close(out.loss, torch.tensor(-1.0 / 10.0), **ATOL)  # sum(-A) = -1 over a global 10 tokens


def test_kl_term_uses_named_estimator():
    logp, mask, adv = _batch()
    ref = logp.detach() - 0.5  # d = ref - logp = -0.5 everywhere
    out = GRPOLoss(kl=KLSettings(beta=0.1, estimator="k3"))(logp, mask, adv, ref_logp=ref)
    k3 = math.exp(-0.5) + 0.5 - 1.0
    assert_close(out.metrics["kl"], torch.tensor(k3), **ATOL)
    assert_close(out.loss, torch.tensor(-0.2 + 0.1 * k3), **ATOL)
    out = GRPOLoss(kl=KLSettings(beta=0.1, estimator="k1"))(logp, mask, adv, ref_logp=ref)
    assert_close(out.loss, torch.tensor(-0.2 + 0.1 * 0.5), **ATOL)


def test_entropy_bonus_and_llds():
    logp, mask, adv = _batch()
    entropy = torch.tensor([[1.0, 2.0, 3.0], [0.5, 0.5, 9.0]])
    out = GRPOLoss(terms=LossTerms(entropy_coef=0.01))(logp, mask, adv, entropy=entropy)
    # bonus = -0.01 * (1 + 2 + 3 + 0.5 + 0.5) / 5
    assert_close(out.loss, torch.tensor(-0.2 - 0.01 * 7.0 / 5.0), **ATOL)
    old = logp.detach() + torch.tensor([[0.1, 0.0, 0.0], [0.0, 0.0, 0.0]])  # seq 0 fell by 0.1 on token 0
    out = GRPOLoss(terms=LossTerms(llds_coef=2.0))(logp, mask, adv, old_logp=old)
    r = math.exp(-0.1)
    # ppo on seq 0 token 0: ratio r < 1, A = +1 -> -r; others -A; llds: 2 * 0.1 on that token
    expected = (-r - 1.0 - 1.0 + 1.0 + 1.0 + 2.0 * 0.1) / 5.0
    assert_close(out.loss, torch.tensor(expected), **ATOL)


def test_tis_weight_and_mis_zero_weight_stay_in_the_normaliser():
    logp, mask, adv = _batch()
    roll = logp.detach().clone()
    roll[0, 0] -= math.log(4.0)  # exp(old - roll) = 4 on one token
    out = GRPOLoss(off_policy=OffPolicySettings(correction="tis_token", correction_args={"cap": 2.0}))(
        logp, mask, adv, rollout_logp=roll
    )
    assert_close(out.loss, torch.tensor((-2.0 - 1.0 - 1.0 + 1.0 + 1.0) / 5.0), **ATOL)
    out = GRPOLoss(off_policy=OffPolicySettings(correction="mis_token", correction_args={"low": 0.5, "high": 2.0}))(
        logp, mask, adv, rollout_logp=roll
    )
    # the token with ratio 4 gets weight 0 and still counts (verl IcePop): (0 - 1 - 1 + 1 + 1) / 5 = 0
    assert_close(out.loss, torch.tensor(0.0), **ATOL)
    assert_close(out.metrics["masked_frac"], torch.tensor(0.0), **ATOL)
    assert_close(out.metrics["is_frac_masked"], torch.tensor(0.2), **ATOL)
    assert out.metrics["mismatch_max_abs"] == pytest.approx(math.log(4.0), abs=1e-6)
    roll[0, 0] += math.log(4.0) - math.log(2.0)  # ratio 2, inside: weight 2 -> (-2 - 1 - 1 + 1 + 1) / 5
    out = GRPOLoss(off_policy=OffPolicySettings(correction="mis_token", correction_args={"low": 0.5, "high": 2.0}))(
        logp, mask, adv, rollout_logp=roll
    )
    assert_close(out.loss, torch.tensor(-0.4), **ATOL)


def test_off_policy_sequence_mask_drops_negative_drifting_sequence():
    logp, mask, adv = _batch()
    roll = logp.detach() + 0.5  # the engine saw every token 0.5 more likely: drift 0.5 > delta
    out = GRPOLoss(off_policy=OffPolicySettings(sequence_mask_delta=0.1))(logp, mask, adv, rollout_logp=roll)
    # sequence 1 (A = -1) is dropped; sequence 0 remains: -1 per token over 3 tokens
    assert_close(out.loss, torch.tensor(-1.0), **ATOL)
    assert_close(out.metrics["off_policy_masked_frac"], torch.tensor(0.5), **ATOL)


def test_negative_advantage_scale():
    logp, mask, adv = _batch()
    out = GRPOLoss(terms=LossTerms(negative_advantage_scale=0.0))(logp, mask, adv)
    assert_close(out.loss, torch.tensor(-3.0 / 5.0), **ATOL)


def test_top_entropy_mask_keeps_high_entropy_tokens():
    logp, mask, adv = _batch()
    entropy = torch.tensor([[0.1, 0.2, 5.0], [4.0, 0.3, 0.0]])
    out = GRPOLoss(terms=LossTerms(top_entropy_quantile=0.6))(logp, mask, adv, entropy=entropy)
    # valid entropies sorted: .1 .2 .3 4 5; linear 0.6-quantile = 0.3 + 0.4*(4 - 0.3) = 1.78
    # kept: 5.0 (A=+1) and 4.0 (A=-1): loss = (-1 + 1) / 2 = 0
    assert_close(out.loss, torch.tensor(0.0), **ATOL)
    assert_close(out.metrics["masked_frac"], torch.tensor(0.6), **ATOL)


@pytest.mark.parametrize("name", REGISTRIES["policy_loss"].names())
@pytest.mark.parametrize("aggregation", REGISTRIES["aggregation"].names())
def test_every_policy_loss_and_aggregation_composes(name, aggregation):
    torch.manual_seed(0)
    logp = (torch.randn(4, 6) * 0.3 - 1.0).requires_grad_()
    old = logp.detach() + torch.randn(4, 6) * 0.05
    mask = torch.ones(4, 6)
    mask[1, 4:] = 0
    adv = torch.tensor([1.0, -0.5, 0.25, -1.0])
    kwargs = dict(
        policy_loss=name,
        policy_loss_args={"beta": 0.1} if name == "dro" else None,
        aggregation=aggregation,
        aggregation_args={"max_length": 6} if aggregation.endswith("norm") else None,
    )
    required = REGISTRIES["policy_loss"].spec(name).required_aggregation
    if required not in (None, aggregation):  # geo_mean aggregates per sequence itself
        with pytest.raises(ValueError, match=f"needs aggregation '{required}'"):
            GRPOLoss(**kwargs)
        return
    loss = GRPOLoss(**kwargs)
    out = loss(logp, mask, adv, old_logp=old, generator=torch.Generator().manual_seed(0))
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(logp.grad).all()
    assert logp.grad.abs().sum() > 0


def test_unknown_names_fail_at_construction_listing_valid_names():
    with pytest.raises(ValueError, match=r"unknown policy loss 'ppo2'; valid names: cispo, clip_cov"):
        GRPOLoss(policy_loss="ppo2")
    with pytest.raises(ValueError, match=r"unknown loss aggregation 'mean'"):
        GRPOLoss(aggregation="mean")
    with pytest.raises(ValueError, match=r"unknown rollout correction 'tis'; valid names: mis_seq"):
        GRPOLoss(off_policy=OffPolicySettings(correction="tis"))


def test_missing_inputs_are_named():
    logp, mask, adv = _batch()
    with pytest.raises(ValueError, match="beta > 0 needs ref_logp"):
        GRPOLoss(kl=KLSettings(beta=0.1))(logp, mask, adv)
    with pytest.raises(ValueError, match="need rollout_logp"):
        GRPOLoss(off_policy=OffPolicySettings(correction="tis_token"))(logp, mask, adv)
    with pytest.raises(ValueError, match="need entropy"):
        GRPOLoss(terms=LossTerms(entropy_coef=0.1))(logp, mask, adv)


def test_non_finite_old_logprobs_on_valid_tokens_raise_naming_rows():
    logp, mask, adv = _batch()
    old = logp.detach().clone()
    old[1, 1] = float("nan")
    with pytest.raises(NonFiniteError, match=r"old_logp has 1 non-finite value.*rows \[1\]"):
        GRPOLoss()(logp, mask, adv, old_logp=old)
    old = logp.detach().clone()
    old[1, 2] = float("nan")  # padding: allowed
    assert torch.isfinite(GRPOLoss()(logp, mask, adv, old_logp=old).loss)


def test_all_tokens_masked_gives_zero_loss_and_gradient():
    logp, _, adv = _batch()
    out = GRPOLoss()(logp, torch.zeros(2, 3), adv)
    out.loss.backward()
    assert out.loss.item() == 0.0 and logp.grad.abs().sum().item() == 0.0


def test_importing_core_loads_only_torch():
    code = (
        "import sys, lightning_grpo.core\n"
        "bad = [m for m in ('lightning', 'pytorch_lightning', 'transformers', 'peft', 'vllm', 'torchmetrics') if m in sys.modules]\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
