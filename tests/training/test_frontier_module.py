"""GRPOModule wiring of the 2025-2026 units: rejection masks in the global normaliser, bypass mode
(no trainer pass for old log-probs), opo's completion lengths."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lightning_grpo import AlgorithmSettings, ForwardSettings, GRPOLoss, GRPOModule, OffPolicySettings

from .test_module import _policy, _rollout_batch, _ticks


def _prepared(path, loss: GRPOLoss, **module_args):
    """A module with its policy and a rollout batch whose engine log-probs disagree with the trainer's
    on a few tokens (ratio e^{+-2}) and a whole row (e^{0.9} on every token)."""
    policy = _policy(path)
    module = GRPOModule(
        model=policy,
        loss=loss,
        forward=ForwardSettings(rows_per_pass=8),
        optimizer=lambda p: torch.optim.SGD(p, lr=0.5),
        **module_args,
    )
    module.configure_model()
    batch = _rollout_batch(policy.config.vocab_size)
    old = module._logprobs_no_grad(batch, reference=False)  # [B, Lc]
    drift = torch.zeros_like(old)
    drift[0, 1], drift[3, 0], drift[6] = 2.0, -2.0, 0.9
    batch.rollout_logp = (old + drift) * batch.completion_mask
    rewards = torch.tensor([[1.0], [0.0], [0.0], [1.0], [1.0], [1.0], [0.0], [0.0]])
    module.use_rollout(module.prepare_rollout_batch(batch, rewards, torch.ones(1)))
    return module, module.rollout_batch, old


def _fit_once(module, accumulate: int) -> dict[str, torch.Tensor]:
    trainer = L.Trainer(
        max_steps=1,
        accumulate_grad_batches=accumulate,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, train_dataloaders=_ticks(accumulate))
    return {k: v.detach().clone() for k, v in module.policy.state_dict().items()}


def test_rejected_tokens_leave_the_global_normaliser(tiny_model_path):
    loss = GRPOLoss(off_policy=OffPolicySettings(rejection={"token_k1": 2.0, "seq_mean_k1": [0.5, 2.0]}))
    module, batch, old = _prepared(tiny_model_path, loss)
    expected_keep = batch.completion_mask.clone()
    expected_keep[0, 1] = expected_keep[3, 0] = 0
    expected_keep[6] = 0  # exp(-0.9) = 0.41 < 0.5: the whole row
    torch.testing.assert_close(batch.keep_mask * batch.completion_mask, expected_keep)
    assert batch.old_logp is not None  # computed once for the masks even with one update per batch
    before = {k: v.clone() for k, v in module.policy.state_dict().items()}
    one = _fit_once(module, 1)
    # the same update as an unmasked loss over the kept tokens only (value and normaliser)
    ref, ref_batch, _ = _prepared(tiny_model_path, GRPOLoss())
    ref_batch.completion_mask = expected_keep
    ref_batch.old_logp = old
    assert torch.equal(ref_batch.advantages, batch.advantages)
    ref_after = _fit_once(ref, 1)
    for name in one:
        torch.testing.assert_close(one[name], ref_after[name], atol=2e-6, rtol=0, msg=name)
    assert max((one[n] - before[n]).abs().max().item() for n in one) > 1e-3
    for k in (2, 4):  # gradient accumulation: every micro-batch normalises by the kept tokens of the mini-batch
        split_module, _, _ = _prepared(
            tiny_model_path,
            GRPOLoss(off_policy=OffPolicySettings(rejection={"token_k1": 2.0, "seq_mean_k1": [0.5, 2.0]})),
        )
        split = _fit_once(split_module, k)
        for name in one:
            torch.testing.assert_close(split[name], one[name], atol=2e-6, rtol=0, msg=f"{name} (k={k})")


def test_bypass_mode_skips_the_old_logprob_pass(tiny_model_path, monkeypatch):
    module, batch, _ = _prepared(
        tiny_model_path,
        GRPOLoss(off_policy=OffPolicySettings(bypass=True)),
        algorithm=AlgorithmSettings(steps_per_generation=2),
    )
    assert batch.old_logp is None and batch.keep_mask is None
    calls = []
    monkeypatch.setattr(module, "_logprobs_no_grad", lambda *a, **k: calls.append(a))
    _fit_once(module, 1)
    assert calls == []  # no trainer pass: old = the engine's log-probs in the loss


def test_opo_gets_the_completion_lengths(tiny_model_path):
    module, batch, _ = _prepared(tiny_model_path, GRPOLoss(), algorithm=AlgorithmSettings(advantage="opo"))
    # group 0: rewards [1, 0, 0, 1], lengths [4, 2, 4, 4]: baseline 8 / 14
    lengths = batch.completion_mask.sum(-1)
    assert lengths[:4].tolist() == [4.0, 2.0, 4.0, 4.0]
    b = 8.0 / 14.0
    torch.testing.assert_close(batch.advantages[:4], torch.tensor([1 - b, -b, -b, 1 - b]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ["sapo", "dppo_tv", "dppo_kl", "geo_mean", "gpg", "reinforce"])
def test_new_policy_losses_train_through_the_module(tiny_model_path, name):
    module, _, _ = _prepared(
        tiny_model_path, GRPOLoss(policy_loss=name), algorithm=AlgorithmSettings(steps_per_generation=2)
    )
    before = {k: v.clone() for k, v in module.policy.state_dict().items()}
    after = _fit_once(module, 1)
    assert max((after[n] - before[n]).abs().max().item() for n in after) > 0


@pytest.mark.parametrize("correction", ["tis_token", "tis_seq", "mis_token"])
def test_is_batch_normalisation_does_not_depend_on_the_micro_batch_size(tiny_model_path, correction):
    """The IS weights are divided by their mean over the whole optimizer-step batch (summed over
    micro-batches and ranks before any micro-batch runs), so splitting it changes nothing; per
    micro-batch means would differ here (the drifted tokens sit in different micro-batches)."""
    args = {"cap": 10.0} if correction.startswith("tis") else {"low": 0.1, "high": 5.0}  # in-band weights 0.14, 0.41

    def make():
        return GRPOLoss(
            off_policy=OffPolicySettings(correction=correction, correction_args=args, is_batch_normalize=True)
        )

    module, batch, _ = _prepared(tiny_model_path, make())
    assert batch.old_logp is not None  # computed once, so the statistic needs no extra forward
    one = _fit_once(module, 1)
    for k in (2, 4):
        split_module, _, _ = _prepared(tiny_model_path, make())
        split = _fit_once(split_module, k)
        for name in one:
            torch.testing.assert_close(split[name], one[name], atol=2e-6, rtol=0, msg=f"{name} (k={k})")
