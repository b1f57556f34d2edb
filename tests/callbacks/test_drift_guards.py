"""Drift guards, provoked on the tiny model: a reward that pays for length (LengthGuard) and a
held-out split whose rule differs from the training rule (RewardHackingGuard)."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger

from lightning_grpo import (
    GRPOModule,
    LengthGuard,
    PromptDataModule,
    RewardHackingGuard,
    RewardSpec,
    RolloutCallback,
    SamplingConfig,
)
from lightning_grpo.data.sources import Rows
from lightning_grpo.data.tasks import DigitTask, digit_task
from tests.helpers.guards import LOGS_EVERY_STEP


def _policy(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path)


def _fit(module, rewards, callbacks, steps, *, max_new_tokens=2, dm=None, val_every=None, logger=False):
    rollout = RolloutCallback(
        engine="hf",
        sampling=SamplingConfig(n=8, temperature=1.0, max_new_tokens=max_new_tokens),
        rewards=rewards,
        seed=0,
    )
    L.seed_everything(0)
    trainer = L.Trainer(
        max_steps=steps,
        callbacks=[rollout, *callbacks],
        accelerator="cpu",
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=1.0 if val_every else 0,
        val_check_interval=val_every,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
    )
    trainer.fit(module, datamodule=dm or PromptDataModule(DigitTask(), batch_size=8))
    return trainer


def _adamw(lr):
    return lambda p: torch.optim.AdamW(p, lr=lr, weight_decay=0.0)


def test_a_reward_that_pays_for_length_trips_the_length_alarm(tiny_model_path):
    """5 steps that pay for short answers bring the length from 7.3 to about 2 of 8 tokens; then a
    total reward of prefix_match + length/8 grows the completions back to 8 within 10 steps while
    prefix_match stays near 0 (measured): the alarm fires."""
    module = GRPOModule(model=_policy(tiny_model_path), optimizer=_adamw(1e-2))
    _fit(module, [RewardSpec("length", weight=-1.0, kwargs={"max_length": 8})], [], steps=5, max_new_tokens=8)
    rewards = [RewardSpec("prefix_match"), RewardSpec("length", kwargs={"max_length": 8})]
    guard = LengthGuard(window=8, reward="prefix_match")
    _fit(GRPOModule(model=module.policy, optimizer=_adamw(1e-2)), rewards, [guard], steps=16, max_new_tokens=8)
    assert guard.alarms, "length blow-up not detected"
    message = guard.alarms[0]["message"]
    assert message.startswith("completion length grew ") and "while the reward prefix_match changed by" in message
    assert "seq_mean_token_sum_norm" in message and "soft_overlong" in message


@pytest.mark.parametrize(
    ("lengths", "rewards", "fires"),
    [
        ([2, 2, 3, 3, 4, 4, 5, 5], [0.1] * 8, True),  # 2 -> 5 tokens, reward flat
        ([2, 2, 3, 3, 4, 4, 5, 5], [0.1, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7], False),  # longer and better
        ([2, 2, 2, 2, 2.5, 2.5, 2.5, 2.5], [0.1] * 8, False),  # +25%: below rise_factor 1.5
        ([1, 1, 1, 1, 1.6, 1.6, 1.8, 1.8], [0.1] * 8, False),  # x1.7 but only +0.7 tokens (min_tokens 1)
    ],
)
def test_length_guard_rule(lengths, rewards, fires):
    from types import SimpleNamespace

    guard = LengthGuard(window=8)
    module = SimpleNamespace(rollout_metrics={}, log=lambda *a, **k: None)
    trainer = SimpleNamespace(global_step=0, global_rank=0, loggers=[], log_dir=None, callbacks=[], **LOGS_EVERY_STEP)
    for length, reward in zip(lengths, rewards):
        module.rollout_metrics = {"completion_length_mean": length, "reward_mean": reward}
        guard.on_rollout_end(trainer, module, None)
    assert bool(guard.alarms) == fires


@pytest.mark.parametrize("heldout_rule", ["first_digit", "last_plus_one"])
def test_a_heldout_split_with_another_rule_trips_the_reward_hacking_alarm(tiny_model_path, tmp_path, heldout_rule):
    """Train on (last + 1) mod 10 at lr 2e-3: the training reward rises 0.22 -> 0.45 between the
    validations at steps 100 and 150. Held out on the first digit (another rule) the held-out
    reward stays near 0.14 and the alarm fires; held out on the same rule it rises too: no alarm."""
    train, _ = digit_task(rule="last_plus_one")
    _, val = digit_task(rule=heldout_rule)
    dm = PromptDataModule(batch_size=8, source=Rows(train, val=val))
    guard = RewardHackingGuard(window=3)
    module = GRPOModule(model=_policy(tiny_model_path), optimizer=_adamw(2e-3))
    trainer = _fit(
        module,
        [RewardSpec("prefix_match")],
        [guard],
        steps=150,
        dm=dm,
        val_every=25,
        logger=CSVLogger(tmp_path, name="run"),
    )
    if heldout_rule == "first_digit":
        assert [a["step"] for a in guard.alarms] == [150]
        assert guard.alarms[0]["message"].startswith("training reward rose ")
        assert "reward hacking or overfitting" in guard.alarms[0]["message"]
        records = [json.loads(line) for line in Path(f"{trainer.log_dir}/alarms.jsonl").read_text().splitlines()]
        assert [r["guard"] for r in records] == ["reward_hacking"]
        metrics = Path(f"{trainer.log_dir}/metrics.csv").read_text()
        assert "alarm/reward_hacking" in metrics  # written to the loggers at validation
    else:
        assert guard.alarms == []


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: RewardHackingGuard(window=1), r"RewardHackingGuard.window must be >= 2"),
        (lambda: RewardHackingGuard(min_train_rise=0), r"RewardHackingGuard.min_train_rise must be > 0"),
        (lambda: LengthGuard(window=3), r"LengthGuard.window must be >= 4"),
        (lambda: LengthGuard(rise_factor=1.0), r"LengthGuard.rise_factor must be > 1, got 1.0"),
        (lambda: LengthGuard(action="fix"), r"LengthGuard.action must be one of warn, skip, stop; got 'fix'"),
    ],
)
def test_drift_guard_settings_are_checked(build, message):
    with pytest.raises(ValueError, match=message):
        build()
