"""Guards on the tiny model: each failure mode is provoked, the detector must fire and the guard
must act (finite weights, skipped-step count, stop message)."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger

from lightning_grpo import (
    AlgorithmSettings,
    EntropyGuard,
    GRPOModule,
    IdenticalSamplesGuard,
    LogProbGuard,
    MismatchGuard,
    NonFiniteGuard,
    PromptDataModule,
    RewardSpec,
    RolloutCallback,
    SamplingConfig,
    WeightSyncSettings,
    ZeroStdGuard,
)
from lightning_grpo.data.tasks import DigitTask
from lightning_grpo.rollout.base import Rollout, RolloutEngine
from lightning_grpo.rollout.hf import HFEngine

EOS, PAD = 1, 0


def _policy(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path)


def _fit(module, callbacks, steps, *, lr_logger_dir=None, n=4, batch_size=4, rewards=None, **callback_kwargs):
    """Train ``steps`` steps with the HF engine (unless a callback in ``callbacks`` is a RolloutCallback)."""
    rollout = next((c for c in callbacks if isinstance(c, RolloutCallback)), None)
    if rollout is None:
        rollout = RolloutCallback(
            engine="hf",
            sampling=SamplingConfig(n=n, max_new_tokens=3),
            rewards=rewards or [RewardSpec("prefix_match")],
            seed=3,
            **callback_kwargs,
        )
        callbacks = [rollout, *callbacks]
    L.seed_everything(0)
    logger = CSVLogger(lr_logger_dir, name="run") if lr_logger_dir else False
    trainer = L.Trainer(
        max_steps=steps,
        callbacks=callbacks,
        accelerator="cpu",
        logger=logger,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(module, datamodule=PromptDataModule(DigitTask(), batch_size=batch_size))
    return trainer


def _all_finite(module) -> bool:
    return all(torch.isfinite(p).all() for p in module.policy.parameters())


class WeightSnapshots(L.Callback):
    """The policy's weights before each optimizer step and after the last."""

    def __init__(self):
        self.before: list[list[torch.Tensor]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.before.append([p.detach().clone() for p in pl_module.policy.parameters()])


class NaNGradients(L.Callback):
    """Writes NaN into one gradient after the backward of the given optimizer steps."""

    def __init__(self, steps):
        self.steps = set(steps)

    def on_after_backward(self, trainer, pl_module):
        if trainer.global_step in self.steps:
            next(pl_module.policy.parameters()).grad[0, 0] = float("nan")


class NaNLogProbs(L.Callback):
    """Writes NaN into ``tensor`` of the fresh rollout batch (rows ``rows``) at one step; listed
    before the guard, so its ``on_rollout_end`` runs first."""

    def __init__(self, step, tensor="old_logp", rows=(1, 5)):
        self.step, self.tensor, self.rows = step, tensor, list(rows)

    def on_rollout_end(self, trainer, pl_module, batch):
        if trainer.global_step == self.step:
            getattr(batch, self.tensor)[self.rows, 0] = float("nan")


# ----------------------------------------------------------------- non-finite gradients
def test_nan_gradient_step_is_skipped_and_the_run_goes_on(tiny_model_path):
    module = GRPOModule(model=_policy(tiny_model_path), optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2))
    guard, snapshots = NonFiniteGuard(), WeightSnapshots()
    trainer = _fit(module, [snapshots, NaNGradients({2}), guard], steps=5)
    assert trainer.global_step == 5 and _all_finite(module)
    assert module.skipped_steps == 1 and guard.total == 1
    assert [(a["step"], a["action"]) for a in guard.alarms] == [(2, "skip")]
    assert "gradient norm is nan" in guard.alarms[0]["message"]
    # step 2 changed nothing (no update, no weight decay, no moments); steps 1 and 3 did
    assert all(torch.equal(a, b) for a, b in zip(snapshots.before[2], snapshots.before[3]))
    assert not all(torch.equal(a, b) for a, b in zip(snapshots.before[1], snapshots.before[2]))
    assert not all(torch.equal(a, b) for a, b in zip(snapshots.before[3], snapshots.before[4]))


def test_nan_gradients_in_a_row_stop_the_run(tiny_model_path):
    module = GRPOModule(model=_policy(tiny_model_path), optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2))
    guard = NonFiniteGuard(max_consecutive=3)
    trainer = _fit(module, [NaNGradients({1, 2, 3, 4, 5}), guard], steps=8)
    assert trainer.global_step == 4 and _all_finite(module)  # steps 1, 2, 3 skipped; stopped after 3
    assert module.skipped_steps == 3
    assert [a["action"] for a in guard.alarms] == ["skip", "skip", "stop"]
    assert "for 3 optimizer steps in a row (max_consecutive=3)" in guard.stop_message
    assert guard.stop_message.startswith("[non_finite] step 3:")


def test_nan_gradient_with_stop_action_stops_at_once(tiny_model_path):
    module = GRPOModule(model=_policy(tiny_model_path), optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2))
    guard = NonFiniteGuard(action="stop")
    trainer = _fit(module, [NaNGradients({1}), guard], steps=5)
    assert trainer.global_step == 2 and _all_finite(module) and module.skipped_steps == 1
    assert guard.stop_message == "[non_finite] step 1: gradient norm is nan"


# -------------------------------------------------------------- non-finite log-probs
def _two_iteration_module(
    path, default_guards: bool = True
):  # num_iterations=2: old log-probs are computed by the trainer
    return GRPOModule(
        model=_policy(path),
        algorithm=AlgorithmSettings(num_iterations=2),
        default_guards=default_guards,
        optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2),
    )


def test_nan_old_logprobs_stop_the_run_naming_tensor_rows_and_step(tiny_model_path):
    module = _two_iteration_module(tiny_model_path)
    guard = LogProbGuard()
    trainer = _fit(module, [NaNLogProbs(step=2), guard], steps=6)
    assert guard.stop_message == (
        "[non_finite_logprobs] step 2: old_logp is non-finite on valid tokens of rows [1, 5] (of 16 rows); likely "
        "causes: non-finite weights (NonFiniteGuard), fp16 overflow in the engine or the trainer (use bf16 / fp32), "
        "-inf log-probs from top-k / top-p truncation"
    )
    assert trainer.global_step == 3 and module.skipped_steps == 1 and _all_finite(module)


def test_nan_old_logprobs_with_skip_keep_the_run_going(tiny_model_path):
    module = _two_iteration_module(tiny_model_path)
    guard = LogProbGuard(action="skip")
    trainer = _fit(module, [NaNLogProbs(step=2, tensor="rollout_logp", rows=[0]), guard], steps=6)
    assert trainer.global_step == 6 and module.skipped_steps == 1 and _all_finite(module)
    assert [(a["step"], a["action"]) for a in guard.alarms] == [(2, "skip")]
    assert "rollout_logp is non-finite on valid tokens of rows [0]" in guard.alarms[0]["message"]


def test_without_the_guard_the_loss_names_tensor_rows_and_step(tiny_model_path):
    from lightning_grpo.core.guards import NonFiniteError

    module = _two_iteration_module(
        tiny_model_path, default_guards=False
    )  # no guard at all (the defaults would stop it)
    with pytest.raises(NonFiniteError, match=r"^step 2, micro-batch 0: old_logp .*rows \[1, 5\]"):
        _fit(module, [NaNLogProbs(step=2)], steps=4)


# ----------------------------------------------------------------- identical samples
class SharedSeedEngine(RolloutEngine):
    """A seeding bug: every sample of a group replays the same random draws (here: one
    sample per prompt, repeated G times, with its genuine log-probs)."""

    needs_weight_sync = False

    def __init__(self, inner: RolloutEngine):
        self.inner = inner

    def generate(self, prompt_ids, sampling, seed):
        one = self.inner.generate(prompt_ids, replace(sampling, n=1), seed)
        G = sampling.n

        def rep(xs):
            return [x for x in xs for _ in range(G)]

        return Rollout(one.prompt_ids, rep(one.completion_ids), rep(one.logprobs), rep(one.finished), group_size=G)

    def load_weights(self, weights, version=None):
        pass

    def score(self, sequences):
        return self.inner.score(sequences)  # the weights are the inner engine's


@pytest.mark.parametrize("shared_seed", [True, False])
def test_identical_samples_alarm_fires_only_for_the_seeding_bug(tiny_model_path, shared_seed):
    policy = _policy(tiny_model_path)
    module = GRPOModule(model=policy, optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3))
    engine = HFEngine(policy, EOS, PAD)
    rollout = RolloutCallback(
        engine="hf",
        sampling=SamplingConfig(n=4, temperature=1.0, max_new_tokens=3),
        rewards=[RewardSpec("prefix_match")],
        seed=3,
    )
    rollout.use_engine(SharedSeedEngine(engine) if shared_seed else engine)
    guard = IdenticalSamplesGuard()
    _fit(module, [rollout, guard], steps=3)
    if shared_seed:
        assert [a["step"] for a in guard.alarms] == [0, 1, 2]
        assert guard.alarms[0]["message"].startswith("4/4 groups have 4 token-identical completions at temperature 1")
        assert "share one random seed" in guard.alarms[0]["message"]
    else:  # an untrained policy at T = 1 never repeats a group by chance
        assert guard.alarms == []


# --------------------------------------------------------------------- zero reward std
def constant_reward(completions, **columns):
    return [0.5] * len(completions)


def test_zero_std_alarm_suggests_dynamic_sampling(tiny_model_path):
    module = GRPOModule(model=_policy(tiny_model_path))
    guard = ZeroStdGuard(threshold=0.5, window=2)
    _fit(module, [guard], steps=3, rewards=[RewardSpec(constant_reward)])
    assert [a["step"] for a in guard.alarms] == [1, 2]  # from the first full window on
    assert guard.alarms[0]["message"].startswith(
        "100% of groups have zero reward std over the last 2 batches (reward mean 0.5)"
    )
    assert "rollout.selection.dynamic_sampling: true" in guard.alarms[0]["message"]


# --------------------------------------------------------------------- alarm records
def test_alarms_are_logged_as_columns_and_jsonl(tiny_model_path, tmp_path):
    module = GRPOModule(model=_policy(tiny_model_path), optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2))
    trainer = _fit(module, [NaNGradients({1}), NonFiniteGuard()], steps=3, lr_logger_dir=tmp_path)
    rows = list(csv.DictReader(Path(f"{trainer.log_dir}/metrics.csv").read_text().splitlines()))
    fired = {int(r["step"]): float(r["alarm/non_finite"]) for r in rows if r.get("alarm/non_finite")}
    assert fired == {0: 0.0, 1: 1.0, 2: 0.0}
    skipped = {int(r["step"]): float(r["train/skipped_steps"]) for r in rows if r.get("train/skipped_steps")}
    assert skipped == {0: 0.0, 1: 1.0, 2: 1.0}
    records = [json.loads(line) for line in Path(f"{trainer.log_dir}/alarms.jsonl").read_text().splitlines()]
    assert records == [
        {
            "step": 1,
            "guard": "non_finite",
            "action": "skip",
            "message": "gradient norm is nan",
            "completions": "completions.jsonl step 1",
        }
    ]
    logged = [json.loads(line) for line in Path(f"{trainer.log_dir}/completions.jsonl").read_text().splitlines()]
    assert 1 in {row["step"] for row in logged}  # the rows the alarm points to


# --------------------------------------------------------------------- configuration errors
@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: NonFiniteGuard(action="pause"), r"NonFiniteGuard.action must be one of warn, skip, stop; got 'pause'"),
        (lambda: NonFiniteGuard(max_consecutive=0), r"NonFiniteGuard.max_consecutive must be >= 1, got 0"),
        (lambda: EntropyGuard(), r"EntropyGuard needs at least one of floor, ceiling, collapse_factor, rise_factor"),
        (lambda: EntropyGuard(collapse_factor=0.5), r"EntropyGuard.collapse_factor must be > 1, got 0.5"),
        (lambda: MismatchGuard(max_k3=None), r"MismatchGuard needs max_k3 or max_abs"),
        (lambda: ZeroStdGuard(threshold=0), r"ZeroStdGuard.threshold must be in \(0, 1\], got 0"),
        (lambda: IdenticalSamplesGuard(threshold=2), r"IdenticalSamplesGuard.threshold must be in \(0, 1\], got 2"),
    ],
)
def test_guard_settings_are_checked(build, message):
    with pytest.raises(ValueError, match=message):
        build()


# ------------------------------------------------------------------ entropy collapse
@pytest.mark.parametrize(("lr", "fires"), [(1e-2, True), (1e-3, False)])
def test_destructive_learning_rate_trips_the_entropy_alarm(tiny_model_path, lr, fires):
    """lr 1e-2 drives the entropy from 3.9 to ~0.03 within 50 steps while the reward stays near
    0.1 (measured; quickstart-task.md); lr 1e-3 is the quickstart's and stays above 3."""
    module = GRPOModule(
        model=_policy(tiny_model_path), optimizer=lambda p: torch.optim.AdamW(p, lr=lr, weight_decay=0.0)
    )
    guard = EntropyGuard(floor=0.2, max_reward=0.5)
    rollout = RolloutCallback(
        engine="hf",
        sampling=SamplingConfig(n=8, temperature=1.0, max_new_tokens=2),
        rewards=[RewardSpec("prefix_match")],
        seed=0,
    )
    _fit(module, [rollout, guard], steps=50, batch_size=8)
    if fires:
        assert guard.alarms, "entropy collapse not detected"
        first = guard.alarms[0]["message"]
        assert first.startswith("entropy collapse: ") and "below floor 0.2" in first
        assert "eps_high" in first and "clip_cov" in first and "qae" in first and "entropy_coef" in first
    else:
        assert guard.alarms == []


# --------------------------------------------------------------- stale engine: mismatch alarm
@pytest.mark.vllm
@pytest.mark.parametrize("weight_sync", [False, True])
def test_stale_engine_trips_the_mismatch_alarm(tiny_model_path, vllm_engine, weight_sync):
    module = GRPOModule(model=_policy(tiny_model_path), optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2))
    rollout = RolloutCallback(
        engine="vllm",
        sampling=SamplingConfig(n=4, temperature=1.0, max_new_tokens=3),
        rewards=[RewardSpec("prefix_match")],
        seed=3,
        weight_sync=WeightSyncSettings(enabled=weight_sync),
    )
    rollout.use_engine(vllm_engine)
    guard = MismatchGuard(max_k3=1e-3)
    _fit(module, [rollout, guard], steps=6)
    if weight_sync:
        assert guard.alarms == []
    else:
        assert guard.alarms and guard.alarms[0]["step"] <= 3
        message = guard.alarms[0]["message"]
        assert message.startswith("rollout and trainer log-probs disagree (mismatch_k3 ")
        assert "tis_token" in message and "rollout.weight_sync" in message


# ------------------------------------------------------------------------- reward timeouts
HANG = __import__("threading").Event()


def hang_on_odd_generations(completions, **columns):
    """Hangs (until released) on every second call: generations 1, 3, ... time out."""
    hang_on_odd_generations.calls = getattr(hang_on_odd_generations, "calls", 0) + 1
    if hang_on_odd_generations.calls % 2 == 0:
        HANG.wait(20)
    return [1.0] * len(completions)


def test_a_hanging_reward_is_scored_zero_and_counted_in_training(tiny_model_path):
    module = GRPOModule(model=_policy(tiny_model_path))
    hang_on_odd_generations.calls = -1  # the reward probe (data/reward_probe.py) calls it once before training
    spec = RewardSpec(hang_on_odd_generations, timeout_s=0.5, on_timeout="zero")
    seen = []

    class Seen(L.Callback):
        def on_rollout_end(self, trainer, pl_module, batch):
            seen.append(
                (
                    pl_module.rollout_metrics["reward/hang_on_odd_generations/timeouts"],
                    pl_module.rollout_metrics["reward_mean"],
                )
            )

    try:
        trainer = _fit(module, [Seen()], steps=4, rewards=[spec, RewardSpec("prefix_match")])
    finally:
        HANG.set()
    assert trainer.global_step == 4
    assert [count for count, _ in seen] == [0.0, 1.0, 1.0, 2.0]


def full_reward(completions, **columns):
    return [1.0] * len(completions)


def test_zero_std_alarm_stays_quiet_once_the_task_is_learned(tiny_model_path):
    module = GRPOModule(model=_policy(tiny_model_path))
    guard = ZeroStdGuard(threshold=0.5, max_reward=0.9, window=1)
    _fit(module, [guard], steps=2, rewards=[RewardSpec(full_reward)])
    assert guard.alarms == []


def test_entropy_explosion_alarm_fires_when_entropy_rises(tiny_model_path):
    """Collapse the policy first (lr 1e-2), then push its entropy up hard (entropy bonus 1.0): the
    rise over the window and the ceiling both trip the explosion alarm."""
    from lightning_grpo import GRPOLoss, LossTerms

    policy = _policy(tiny_model_path)
    sampling = SamplingConfig(n=8, temperature=1.0, max_new_tokens=2)

    def rollout():
        return RolloutCallback(engine="hf", sampling=sampling, rewards=[RewardSpec("prefix_match")], seed=0)

    collapse = GRPOModule(model=policy, optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.0))
    _fit(collapse, [rollout()], steps=50, batch_size=8)
    rise, ceiling = EntropyGuard(rise_factor=5.0, window=20), EntropyGuard(ceiling=2.0)
    explode = GRPOModule(
        model=policy,
        loss=GRPOLoss(terms=LossTerms(entropy_coef=1.0)),
        optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.0),
    )
    _fit(explode, [rollout(), rise, ceiling], steps=40, batch_size=8)
    assert rise.alarms and ceiling.alarms, "entropy explosion not detected"
    first = rise.alarms[0]["message"]
    assert first.startswith("entropy explosion: rose ") and "x in 20 steps" in first
    assert "add a KL term (loss.init_args.kl.beta)" in first
    assert (
        ceiling.alarms[0]["message"].startswith("entropy explosion: ")
        and "above ceiling 2" in ceiling.alarms[0]["message"]
    )


def test_guards_of_one_type_have_distinct_state_keys():
    assert EntropyGuard(floor=0.1).state_key != EntropyGuard(ceiling=3.0).state_key
    guard = NonFiniteGuard()
    key = guard.state_key
    guard.consecutive, guard.total = 2, 5  # state, not settings: the key stays
    assert guard.state_key == key == "NonFiniteGuard{'action': 'skip', 'max_consecutive': 3}"


def test_guard_state_and_skipped_steps_survive_a_checkpoint(tiny_model_path, tmp_path):
    module = GRPOModule(model=_policy(tiny_model_path), optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2))
    trainer = _fit(module, [NaNGradients({1}), NonFiniteGuard(), EntropyGuard(floor=0.01)], steps=2)
    trainer.save_checkpoint(tmp_path / "run.ckpt")
    resumed = GRPOModule(model=_policy(tiny_model_path), optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2))
    guard = NonFiniteGuard()
    L.seed_everything(0)
    trainer = L.Trainer(
        max_steps=3,
        callbacks=[
            RolloutCallback(
                engine="hf",
                sampling=SamplingConfig(n=4, max_new_tokens=3),
                rewards=[RewardSpec("prefix_match")],
                seed=3,
            ),
            guard,
            EntropyGuard(floor=0.01),
        ],
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(resumed, datamodule=PromptDataModule(DigitTask(), batch_size=4), ckpt_path=tmp_path / "run.ckpt")
    assert trainer.global_step == 3 and guard.total == 1 and resumed.skipped_steps == 1
