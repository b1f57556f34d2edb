"""GRPOModule: log-probs, micro-batching and gradient accumulation, forward-pass budget."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from lightning_grpo import AlgorithmSettings, ForwardSettings, GRPOLoss, GRPOModule, PolicySettings
from lightning_grpo.core.batch import RolloutBatch, micro_step


def _policy(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).train()


def _rollout_batch(vocab: int, seed: int = 0) -> RolloutBatch:
    gen = torch.Generator().manual_seed(seed)
    B, Lp, Lc = 8, 3, 4
    ids = torch.randint(5, vocab, (B, Lp + Lc), generator=gen)
    attn = torch.ones(B, Lp + Lc, dtype=torch.long)
    attn[0, 0] = 0  # a left-padded prompt
    mask = torch.ones(B, Lc)
    mask[1, 2:] = 0  # completions of different lengths
    mask[5, 1:] = 0
    attn[:, Lp:] = mask.long()
    return RolloutBatch(
        input_ids=ids,
        attention_mask=attn,
        completion_mask=mask,
        advantages=torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.25, -0.25]),
        rollout_logp=torch.zeros(B, Lc),
        prompt_length=Lp,
        group_size=4,
        temperature=0.7,
    )


def _ticks(n: int) -> DataLoader:
    return DataLoader([{"micro": m} for m in range(n)], batch_size=None)


def _one_update(path, accumulate: int, aggregation: str, metrics: dict | None = None) -> dict[str, torch.Tensor]:
    policy = _policy(path)
    agg_args = {"max_length": 4} if aggregation.endswith("norm") else None
    module = GRPOModule(
        model=policy,
        loss=GRPOLoss(aggregation=aggregation, aggregation_args=agg_args),
        optimizer=lambda p: torch.optim.SGD(p, lr=0.5),
    )
    module.use_rollout(_rollout_batch(policy.config.vocab_size))
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
    if metrics is not None:
        metrics.update({k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("train/")})
    return {k: v.detach().clone() for k, v in policy.state_dict().items()}


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_accumulate_grad_batches_equals_one_large_batch(tiny_model_path, aggregation):
    before = _policy(tiny_model_path).state_dict()
    one = _one_update(tiny_model_path, 1, aggregation)
    for k in (2, 4):
        split = _one_update(tiny_model_path, k, aggregation)
        moved = max((one[n] - before[n]).abs().max().item() for n in one)
        assert moved > 1e-3  # the update is visible ...
        for name in one:  # ... and identical to the one-batch update
            torch.testing.assert_close(split[name], one[name], atol=2e-6, rtol=0, msg=f"{name} (k={k})")


def test_logged_step_metrics_do_not_depend_on_accumulation(tiny_model_path):
    """Every loss metric of a step (token-weighted means, the summed loss, ratio min / max, the
    mismatch max) and the gradient norm are the same whether the step is one batch or k micro-batches."""
    one: dict[str, float] = {}
    _one_update(tiny_model_path, 1, "token_mean", one)
    for name in (
        "train/entropy",
        "train/loss",
        "train/ratio_min",
        "train/ratio_max",
        "train/clip_frac_low",
        "train/mismatch_k3",
        "train/mismatch_max_abs",
        "train/grad_norm",
        "train/skipped_steps",
    ):
        assert name in one, name
    assert one["train/grad_norm"] > 0 and one["train/skipped_steps"] == 0
    for k in (2, 4):
        split: dict[str, float] = {}
        _one_update(tiny_model_path, k, "token_mean", split)
        assert split.keys() == one.keys()
        for name, value in one.items():
            assert split[name] == pytest.approx(value, abs=2e-6, rel=1e-5), f"{name} (k={k})"


def test_chunked_logprobs_match_full_logits(tiny_model_path):
    policy = _policy(tiny_model_path)
    module = GRPOModule(model=policy)
    batch = _rollout_batch(policy.config.vocab_size)
    out = module.token_logprobs(policy, batch, compute_entropy=True)
    pos = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = policy(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=pos).logits
    logp_all = torch.log_softmax(logits[:, 2:-1].float() / 0.7, dim=-1)  # [B, Lc, V]
    expected = logp_all.gather(-1, batch.input_ids[:, 3:, None]).squeeze(-1)
    sampled = batch.attention_mask[:, 3:] > 0  # the LM head runs on sampled tokens only: 0 on padding
    assert not sampled.all()
    torch.testing.assert_close(out.logp, torch.where(sampled, expected, 0.0), atol=1e-5, rtol=0)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    torch.testing.assert_close(out.entropy, torch.where(sampled, entropy, 0.0), atol=1e-5, rtol=0)


def test_micro_step_schedule():
    # 10 rows, 2 mini-batches per pass, 2 micro-batches each, 2 passes -> 8 steps per generation
    steps = [micro_step(10, s, steps_per_generation=2, accumulate=2) for s in range(8)]
    assert [s.micro.tolist() for s in steps[:4]] == [[0, 1, 2], [3, 4], [5, 6, 7], [8, 9]]
    assert [s.mini.tolist() for s in steps[:2]] == [[0, 1, 2, 3, 4]] * 2
    assert [s.iteration for s in steps] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [s.micro.tolist() for s in steps[4:]] == [s.micro.tolist() for s in steps[:4]]


def test_unknown_advantage_and_bad_iteration_counts_fail_early():
    # (\w+, )*: an estimator registered by an earlier test of the session (docs/guide/algorithms.md's) sorts in too
    with pytest.raises(
        ValueError, match=r"unknown advantage estimator 'gpro'; valid names: batch_std, (\w+, )*dr_grpo, gpg, grpo"
    ):
        GRPOModule(model="tiny:chars", algorithm=AlgorithmSettings(advantage="gpro"))
    with pytest.raises(ValueError, match=r"^model.algorithm.num_iterations must be an integer >= 1, got 0$"):
        GRPOModule(model="tiny:chars", algorithm=AlgorithmSettings(num_iterations=0))
    with pytest.raises(ValueError, match=r"^model.policy.reference 'adapter' needs model.policy.lora"):
        GRPOModule(model="tiny:chars", policy=PolicySettings(reference="adapter"))


def test_training_step_without_rollouts_explains_the_fix(tiny_model_path):
    module = GRPOModule(model=_policy(tiny_model_path))
    trainer = L.Trainer(
        max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False
    )
    with pytest.raises(RuntimeError, match="add lightning_grpo.RolloutCallback"):
        trainer.fit(module, train_dataloaders=_ticks(1))


def test_validation_without_a_rollout_callback_explains_the_fix(tiny_model_path):
    """The rollout callback scores held-out prompts in its own hooks: without one, validation is one error."""
    module = GRPOModule(model=_policy(tiny_model_path))
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    records = DataLoader([{"prompt": "12=", "prompt_ids": [1, 2, 3]}], batch_size=1, collate_fn=lambda rows: rows)
    with pytest.raises(
        RuntimeError, match=r"^validation needs lightning_grpo.RolloutCallback in the Trainer's callbacks$"
    ):
        trainer.validate(module, dataloaders=records)


def test_logits_path_equals_chunked_path(tiny_model_path):
    policy = _policy(tiny_model_path)
    batch = _rollout_batch(policy.config.vocab_size)
    chunked = GRPOModule(model=policy).token_logprobs(policy, batch, compute_entropy=True)
    forward = GRPOModule(model=policy, forward=ForwardSettings(logprob_path="logits")).token_logprobs(
        policy, batch, compute_entropy=True
    )
    torch.testing.assert_close(forward.logp, chunked.logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(forward.entropy, chunked.entropy, atol=1e-5, rtol=0)
