"""KL in reward (``model.algorithm.kl_in_reward``): the fixed and adaptive controllers as verl's ``kl_ctrl``.

verl (``ray_trainer.apply_kl_penalty``, ``core_algos.AdaptiveKLController``), per generation batch::

    beta = kl_ctrl.value
    token_level_rewards = scores - beta * kld  # kld = k1(old_log_prob, ref_log_prob) * mask
    current_kl = mean_over_rows(masked_mean(kld, mask, axis=-1))
    kl_ctrl.update(current_kl, n_steps=batch_size)  # value *= 1 + clip(kl / target - 1, -.2, .2) * n / horizon
"""

from __future__ import annotations

import pytest
import torch

from lightning_grpo import AlgorithmSettings, GRPOModule, KLInRewardSettings

from .test_module import _policy, _rollout_batch


class VerlAdaptiveKLController:
    """verl/trainer/ppo/core_algos.py AdaptiveKLController, transcribed (numpy's clip as min / max)."""

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int) -> None:
        self.value, self.target, self.horizon = init_kl_coef, target_kl, horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        proportional_error = min(max(current_kl / self.target - 1, -0.2), 0.2)
        self.value *= 1 + proportional_error * n_steps / self.horizon


def _module(path, kl_in_reward: KLInRewardSettings) -> GRPOModule:
    module = GRPOModule(model=_policy(path), algorithm=AlgorithmSettings(kl_in_reward=kl_in_reward))
    module.configure_model()
    assert module.reference_mode == "copy"  # KL in reward alone asks for a reference
    return module


def _batch_with_kl(module: GRPOModule, offsets: torch.Tensor):
    """A rollout batch whose behaviour log-probs exceed the reference's by ``offsets[row]`` on every completion
    token: each row's token-mean k1 is its offset. Returns (batch, ref_logp)."""
    batch = _rollout_batch(module.policy.config.vocab_size)
    ref = module._logprobs_no_grad(batch, reference=True)  # [B, Lc] (0 off the completion)
    batch.rollout_logp = (ref + offsets[:, None]) * batch.completion_mask
    return batch, ref


REWARDS = torch.tensor([[1.0], [0.0], [0.0], [1.0], [1.0], [0.5], [0.0], [0.0]])


def test_adaptive_kl_in_reward_follows_verl(tiny_model_path):
    settings = KLInRewardSettings(coef=0.2, controller="adaptive", target=0.05, horizon=100)
    module, verl = _module(tiny_model_path, settings), VerlAdaptiveKLController(0.2, 0.05, 100)
    # batch 1: KL far above target (the error clips at +0.2); batch 2: 10% above (the linear part)
    for offsets in (torch.linspace(0.1, 0.8, 8), torch.full((8,), 0.055)):
        batch, ref = _batch_with_kl(module, offsets)
        mask = batch.completion_mask
        beta = verl.value
        shaped = REWARDS[:, 0] - beta * ((batch.rollout_logp - ref) * mask).sum(-1)  # [B]
        current_kl = float((((batch.rollout_logp - ref) * mask).sum(-1) / mask.sum(-1)).mean())
        prepared = module.prepare_rollout_batch(batch, REWARDS, torch.ones(1))
        expected = module.compute_advantages(shaped[:, None], torch.ones(1), batch.group_size, mask.sum(-1))
        torch.testing.assert_close(prepared.advantages, expected, atol=1e-5, rtol=0)
        assert module.reward_kl == pytest.approx(float(offsets.mean()), abs=1e-5)  # rows count alike, not tokens
        assert module.reward_kl == pytest.approx(current_kl, abs=1e-6)
        verl.update(current_kl, n_steps=len(batch))
        assert module.kl_ctrl.value == pytest.approx(verl.value, rel=1e-6)
    assert verl.value == pytest.approx(0.2 * (1 + 0.2 * 8 / 100) * (1 + 0.1 * 8 / 100), rel=1e-4)  # 0.2048...

    resumed, checkpoint = _module(tiny_model_path, settings), {}
    module.on_save_checkpoint(checkpoint)  # the controller's state travels in the checkpoint
    resumed.on_load_checkpoint(checkpoint)
    assert resumed.kl_ctrl.value == module.kl_ctrl.value != 0.2


def test_fixed_kl_in_reward_keeps_its_coefficient(tiny_model_path):
    module = _module(tiny_model_path, KLInRewardSettings(coef=0.3))
    for offsets in (torch.linspace(0.1, 0.8, 8), torch.full((8,), 2.0)):
        batch, ref = _batch_with_kl(module, offsets)
        mask = batch.completion_mask
        shaped = REWARDS[:, 0] - 0.3 * ((batch.rollout_logp - ref) * mask).sum(-1)
        prepared = module.prepare_rollout_batch(batch, REWARDS, torch.ones(1))
        expected = module.compute_advantages(shaped[:, None], torch.ones(1), batch.group_size, mask.sum(-1))
        torch.testing.assert_close(prepared.advantages, expected, atol=1e-5, rtol=0)
        assert module.kl_ctrl.value == 0.3


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(coef=-0.1), r"^model.algorithm.kl_in_reward.coef must be >= 0, got -0.1$"),
        (
            dict(coef=0.0, controller="adaptive"),
            r"^model.algorithm.kl_in_reward.controller 'adaptive' scales the coefficient",
        ),
        (dict(coef=0.1, controller="pid"), r"unknown KL controller 'pid'; valid names: adaptive, fixed"),
        (
            dict(coef=0.1, controller="adaptive", target=0.0),
            r"^model.algorithm.kl_in_reward.target must be > 0, got 0.0$",
        ),
        (
            dict(coef=0.1, controller="adaptive", horizon=0),
            r"^model.algorithm.kl_in_reward.horizon must be an integer > 0, got 0$",
        ),
    ],
)
def test_bad_kl_in_reward_settings_are_one_error(settings, message):
    with pytest.raises(ValueError, match=message):
        KLInRewardSettings(**settings)
