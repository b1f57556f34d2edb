"""The weight push check's rule, on hand-set log-probs: a stand-in trainer (`Scores`) and a stand-in engine
(`Engine`) score a 3-token probe as told, so every gap below is computed by hand.

Calibration measures the engine's noise when the probe is taken; a checked push passes when the engine is within
max(floor, NOISE_MULTIPLE x noise) of the pushed weights or CLOSER times nearer them than the previous push's, or
when the step is hidden in the engine's noise (a bfloat16 engine), unless the engine is STALE times nearer earlier
weights or farther than NOISE_LIMIT x the floor.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from lightning_grpo.callbacks.push_check import (
    CLOSER,
    NOISE_LIMIT,
    NOISE_MULTIPLE,
    STALE,
    TOLERANCES,
    PushCheck,
    WeightPushError,
)

#: The trainer's log-probs of the probe at step 0: sequences [5 6 7] and [8 9] -> 2 + 1 scored tokens.
STEP0 = [[-0.010, -0.020], [-0.005]]
FLOOR = 1e-5  # TOLERANCES[float32]


def moved(logp: list[list[float]], by: float | list[float]) -> list[list[float]]:
    """``logp`` with ``by`` added to every token (a list: one value per token, in order)."""
    flat = iter(by if isinstance(by, list) else [by] * sum(len(row) for row in logp))
    return [[x + next(flat) for x in row] for row in logp]


class Policy(nn.Linear):
    """A float32 stand-in policy whose LoRA adapter `Scores` switches off."""

    def __init__(self, owner: Scores) -> None:
        super().__init__(1, 1)
        self.owner = owner

    @contextlib.contextmanager
    def disable_adapter(self):
        self.owner.adapter_off = True
        yield
        self.owner.adapter_off = False


class Scores:
    """A stand-in GRPOModule: `forward_logprobs` returns ``logp`` (``base`` with the adapter off); counts calls."""

    def __init__(self, logp, base=None) -> None:
        self.logp, self.base, self.adapter_off, self.forwards = logp, base, False, 0
        self.device, self.attached_trainer, self.policy = torch.device("cpu"), None, Policy(self)

    def forward_logprobs(self, policy, batch) -> torch.Tensor:
        self.forwards += 1
        rows = self.base if self.adapter_off else self.logp
        out = torch.zeros(batch.completion_mask.shape)  # [S, Lc]
        for i, row in enumerate(rows):
            out[i, : len(row)] = torch.tensor(row)
        return out


class Engine:
    """A stand-in engine scoring the probe with ``logp`` (one list per sequence) for each named copy."""

    max_model_len, dtype = None, None

    def __init__(self, dtype: torch.dtype | None = None, **copies) -> None:
        self.copies, self.dtype = copies, dtype

    def score(self, probe):
        return {name: [torch.tensor(row) for row in rows] for name, rows in self.copies.items()}


def probed(trainer: Scores, engine: Engine, every: int = 1, tolerance: float | None = None, adapter: bool = False):
    batch = SimpleNamespace(
        input_ids=torch.tensor([[5, 6, 7], [8, 9, 0]]), attention_mask=torch.tensor([[1, 1, 1], [1, 1, 0]])
    )
    check = PushCheck(every=every, tolerance=tolerance, adapter=adapter)
    check.take_probe(trainer, batch, engine, step=0)
    return check


def test_healthy_noise_above_the_floor_passes_once_calibrated():
    trainer = Scores(STEP0)
    check = probed(trainer, Engine(a=moved(STEP0, 1e-6), b=moved(STEP0, 1.29e-5)))  # the noisier copy counts
    assert check.noise == pytest.approx(1.29e-5, rel=1e-3)
    assert check.current_tolerance() == pytest.approx(NOISE_MULTIPLE * 1.29e-5, rel=1e-3)  # 5.16e-5
    trainer.logp = moved(STEP0, 1e-4)  # step 1 moves the probe by 1e-4 per token
    check.after_push(Engine(b=moved(trainer.logp, 1.5e-5)), trainer, step=1)  # d_new 1.5e-5 > the floor; d_old 1.15e-4
    stale = Engine(b=moved(trainer.logp, 1.29e-5))  # step 1's weights + the noise
    trainer.logp = moved(STEP0, 2e-4)  # step 2: d_new 8.71e-5, d_old 1.29e-5
    with pytest.raises(WeightPushError) as err:
        check.after_push(stale, trainer, step=2)
    message = str(err.value)
    assert "by mean |dlogp| 8.71e-05 (tolerance 5.16e-05: 4 x the noise 1.29e-05 measured with the probe)" in message
    assert "and by 1.29e-05 under step 1's" in message and "the engine still holds step 1's weights" in message


def test_a_diverging_step_whose_noise_outgrows_the_tolerance_passes():
    trainer = Scores(STEP0)
    check = probed(trainer, Engine(e=moved(STEP0, 1e-7)))
    assert check.current_tolerance() == FLOOR  # 4 x 1e-7 is below the floor
    trainer.logp = moved(STEP0, [-5.0, -3.0, -4.0])  # the logits blow up: the probe moves by 4 on average
    check.after_push(Engine(e=moved(trainer.logp, 4.88e-5)), trainer, step=1)  # d_new 4.88e-5, d_old 4
    trainer.logp = moved(trainer.logp, -0.5)
    check.after_push(Engine(e=moved(trainer.logp, 4.88e-5)), trainer, step=2)  # d_old 0.5 = 1e4 x d_new


def test_the_engine_must_be_closer_times_nearer_the_pushed_weights():
    trainer = Scores(STEP0)
    check = probed(trainer, Engine(e=STEP0))
    d_new = 1e-4  # above the floor: only the ratio can pass it
    trainer.logp = moved(STEP0, -2 * CLOSER * d_new)  # d_old = 2 x CLOSER x d_new: passes
    check.after_push(Engine(e=moved(trainer.logp, d_new)), trainer, step=1)
    trainer.logp = moved(trainer.logp, -CLOSER * d_new / 2)  # d_old = CLOSER / 2 x d_new: does not
    with pytest.raises(WeightPushError, match=r"mean \|dlogp\| 0\.0001 .*and by 0\.0049 under step 1's .*part of the"):
        check.after_push(Engine(e=moved(trainer.logp, d_new)), trainer, step=2)


def test_a_stale_push_is_caught_and_names_the_step_it_holds():
    trainer = Scores(STEP0)
    check = probed(trainer, Engine(e=moved(STEP0, 1e-6)))
    trainer.logp = moved(STEP0, -0.3)
    with pytest.raises(WeightPushError) as err:
        check.after_push(Engine(e=moved(STEP0, 1e-6)), trainer, step=1)  # the push did nothing
    message = str(err.value)
    assert "\n" not in message and "at step 1 does not sample with the pushed weights" in message
    assert "mean |dlogp| 0.3 (tolerance 1e-05) and by 1e-06 under step 0's (a push that landed is" in message
    assert message.endswith(
        "they match step 0's weights (1e-06): the engine still holds step 0's weights (no layer was updated)"
    )


def test_one_stale_token_in_three_is_part_of_the_weights():
    trainer = Scores(STEP0)
    check = probed(trainer, Engine(e=STEP0))
    trainer.logp = moved(STEP0, -0.3)
    with pytest.raises(
        WeightPushError, match=r"0\.1 \(tolerance 1e-05\) and by 0\.2 under step 0's .*part of the weights"
    ):
        check.after_push(Engine(e=moved(STEP0, [-0.3, 0.0, -0.3])), trainer, step=1)


def test_a_check_after_k_pushes_compares_with_the_push_before_it():
    trainer = Scores(STEP0)
    check = probed(trainer, Engine(e=STEP0), every=3)
    for step in (1, 2, 3):
        trainer.logp = moved(STEP0, -0.1 * step)
        check.after_push(Engine(e=trainer.logp), trainer, step)  # checked at 1; scored at 3, before the check at 4
    assert trainer.forwards == 3  # the probe, the check at 1, the push before the check at 4
    held = trainer.logp
    trainer.logp = moved(STEP0, -0.4)
    with pytest.raises(WeightPushError, match=r"and by 0 under step 3's .*still holds step 3's weights"):
        check.after_push(Engine(e=held), trainer, step=4)
    assert trainer.forwards == 4


def test_check_tolerance_replaces_the_calibrated_tolerance():
    trainer = Scores(STEP0)
    check = probed(trainer, Engine(e=moved(STEP0, 1.29e-5)), tolerance=1e-5)
    assert check.current_tolerance() == 1e-5
    trainer.logp = moved(STEP0, 1e-4)
    with pytest.raises(WeightPushError, match=r"\(tolerance 1e-05, rollout.weight_sync.check_tolerance\)"):
        check.after_push(Engine(e=moved(trainer.logp, 1.5e-5)), trainer, step=1)


def test_an_engine_on_other_weights_when_the_probe_is_taken_stops_there():
    trainer = Scores(STEP0)
    with pytest.raises(WeightPushError) as err:
        probed(trainer, Engine(e=moved(STEP0, 0.3)))
    assert (
        f"at step 0 does not sample with the pushed weights: its log-probs of the probe differ from the trainer's by mean |dlogp| 0.3 (when the probe was taken; at most {NOISE_LIMIT} x 1e-05 is noise)"
        in str(err.value)
    )
    probed(trainer, Engine(e=moved(STEP0, NOISE_LIMIT * FLOOR * 0.9)))  # the most noise allowed


def test_a_missing_adapter_is_named():
    base = moved(STEP0, -0.2)
    trainer = Scores(STEP0, base=base)
    check = probed(trainer, Engine(e=STEP0), adapter=True)
    trainer.logp, trainer.base = moved(STEP0, -0.1), moved(base, -0.05)
    with pytest.raises(WeightPushError, match=r"without its LoRA adapter \(0\): .*\(adapter not loaded\)$"):
        check.after_push(Engine(e=trainer.base), trainer, step=1)
    with pytest.raises(WeightPushError, match=r"at step 0 .*without its LoRA adapter \(0\): .*\(adapter not loaded\)$"):
        probed(Scores(STEP0, base=base), Engine(e=base), adapter=True)  # missing from the start


BF16 = TOLERANCES[torch.bfloat16]  # 5e-2: the floor with a bfloat16 engine
NOISE = 0.0335  # a bfloat16 engine's noise on SmolLM2's probe when it is taken (float32 policy)


def bf16_probed(trainer: Scores) -> PushCheck:
    check = probed(trainer, Engine(torch.bfloat16, e=moved(STEP0, NOISE)))
    assert check.current_tolerance() == pytest.approx(NOISE_MULTIPLE * NOISE)  # 0.134
    return check


def test_a_step_hidden_in_a_bfloat16_engines_grown_noise_passes_with_one_warning(recwarn):
    trainer = Scores(STEP0)
    check = bf16_probed(trainer)
    trainer.logp = moved(STEP0, -0.025)
    check.after_push(Engine(torch.bfloat16, e=moved(trainer.logp, 0.04)), trainer, step=1)  # d_new 0.04: landed
    assert not recwarn.list
    for step in (2, 3):  # the noise grew to 0.159 > 0.134; the step moves the probe by 0.025
        trainer.logp = moved(STEP0, -0.025 * step)
        check.after_push(Engine(torch.bfloat16, e=moved(trainer.logp, 0.159)), trainer, step=step)
    # at step 2: d_new 0.159, d_old 0.134, d_step 0.025; nearest earlier: step 0's, 0.109 (not STALE x nearer)
    (warning,) = recwarn.list  # once
    assert "weight push check at step 2: the engine's log-probs of the probe differ from the trainer's by 0.159" in str(
        warning.message
    )
    assert "while the step moved them by 0.025" in str(warning.message)


def test_a_bfloat16_engine_that_never_takes_a_push_is_caught_once_the_drift_shows():
    trainer = Scores(STEP0)
    check = bf16_probed(trainer)
    frozen = Engine(torch.bfloat16, e=moved(STEP0, NOISE))  # every push dropped: it keeps the probe's weights
    for step in (1, 2, 3, 4):  # d_new = 0.0335 + 0.025 x step <= 0.134: the step is inside the tolerance
        trainer.logp = moved(STEP0, -0.025 * step)
        check.after_push(frozen, trainer, step=step)
    trainer.logp = moved(STEP0, -0.125)  # d_new 0.1585, d_old 0.1335, d_step 0.025: hidden, but step 0's is
    with pytest.raises(WeightPushError) as err:  # 0.0335, STALE x nearer than 0.1585
        check.after_push(frozen, trainer, step=5)
    assert 0.0335 * STALE <= 0.1585
    assert str(err.value).endswith(
        "they match step 0's weights (0.0335): the engine still holds step 0's weights (no layer was updated)"
    )


def test_an_engine_farther_than_any_noise_fails_even_when_the_step_is_hidden():
    trainer = Scores(STEP0)
    check = bf16_probed(trainer)
    trainer.logp = moved(STEP0, -0.025)
    check.after_push(Engine(torch.bfloat16, e=trainer.logp), trainer, step=1)
    trainer.logp = moved(STEP0, -0.05)  # d_new 1.2 > NOISE_LIMIT x 5e-2 = 1.0; d_old 1.175, earlier 1.15
    with pytest.raises(WeightPushError, match=r"mean \|dlogp\| 1\.2 .*part of the weights did not land"):
        check.after_push(Engine(torch.bfloat16, e=moved(trainer.logp, 1.2)), trainer, step=2)
    assert abs(NOISE_LIMIT * BF16 - 1.0) < 1e-12
