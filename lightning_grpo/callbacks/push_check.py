"""The weight push check: after a push, does the engine sample with the weights the trainer pushed?

A push can fail without an error: a LoRA adapter never applied, parameter names that no longer match after
a library upgrade, a weight skipped or rounded away. The engine then keeps sampling from older weights, and
the only trace is a train-inference mismatch that bf16 noise also produces. The check makes it a hard stop.

The probe: the first `PROBE_ROWS` prompt + completion sequences of the run's first rollout batch, cut to
their first `PROBE_TOKENS` tokens (and below the engine's ``max_model_len``). The engine scores it
(`RolloutEngine.score`: log-probs of the given tokens at temperature 1, each copy of its weights apart) and
the trainer scores it with the policy through the training forward (`GRPOModule.forward_logprobs`).

The rule. The engine and the trainer never score the probe alike under the same weights (other kernels, other
summation orders), and by how much depends on the processor, the model and the size of its logits. So:

1. Calibrate: when the probe is taken the engine still holds the trainer's weights; the mean |dlogp| between
   its scores and the trainer's (the largest over the engine's copies) is the run's healthy ``noise``. Above
   `NOISE_LIMIT` x the precision's tolerance it is no noise: the engine already holds other weights, and the
   run stops there.
2. Judge a checked push by the engine's mean |dlogp| to the trainer's scores under the pushed weights
   (``d_new``) and under the previous push's (``d_old``). The push landed when ``d_new`` is within the
   tolerance, ``max(TOLERANCES[precision], NOISE_MULTIPLE * noise)`` (``rollout.weight_sync.check_tolerance``
   replaces it), or when the engine is `CLOSER` times nearer the pushed weights than the previous ones
   (``d_new * CLOSER <= d_old``): a run whose logits grow (one that diverges) grows the noise past the
   tolerance, but its steps move the probe far more than that.
3. Otherwise the engine's noise has outgrown the tolerance, or the push did not land. Which one, the step
   tells: ``d_step``, how far the step moved the trainer's own scores of the probe (old to new weights). When
   the step is visible (``d_step >= VISIBLE * min(d_new, d_old)``) and the engine did not follow it, the push
   did not land: `WeightPushError`, one line, saying what the engine's scores match: older weights (all layers
   stale), the policy without its LoRA adapter (adapter not loaded), or nothing (part of the weights). When the
   step is hidden in the engine's noise (a bfloat16 engine of a float32 policy, whose rounding grows as the
   policy sharpens) the two pushes cannot be told apart; the run stops only if the engine is `STALE` times
   nearer the probe's weights or the last check's than the pushed ones (every push dropped since), or farther
   from the pushed weights than any noise (`NOISE_LIMIT` x the tolerance's floor, as at calibration), and
   otherwise goes on with one warning, once.

What it cannot see: a step that moves the probe less than the tolerance, or less than the engine's distance to
the weights it holds (the stale weights are then as good as the new ones), and a part of the weights that did
not land whose share moves the probe under 1/`CLOSER` of what the whole step moves it.

What it costs: one engine score of the probe when the probe is taken; per check, one engine score and one
trainer forward of the probe under the pushed weights, plus one trainer forward at the push before it (none
with ``check_every: 1``, which reuses the previous check's).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from ..core.batch import RolloutBatch
from ..rollout.base import RolloutEngine

#: Rows of the first rollout batch kept as the probe.
PROBE_ROWS = 2
#: Longest probe sequence, in tokens.
PROBE_TOKENS = 64
#: The tolerance's floor: mean |log-prob difference| on the probe, by the least precise dtype of the run.
TOLERANCES = {torch.float32: 1e-5, torch.float64: 1e-5, torch.float16: 1e-2, torch.bfloat16: 5e-2}
#: The tolerance in multiples of the calibrated noise: room for the noise to grow as training moves the weights
#: (healthy float32 runs stay within 2.3x of it), while a stale step need only move the probe 4x the noise.
NOISE_MULTIPLE = 4
#: A push also landed when the engine is this many times nearer the pushed weights than the previous push's. A
#: float32 step moves the probe 400 to 1e5 times its noise; one of the tiny model's 8 linear groups left stale
#: leaves the engine 1.2 to 28 times nearer (docs/evidence/benchmarks.md, "Weight push check").
CLOSER = 100
#: A step is visible when it moves the trainer's scores of the probe at least this many times the engine's
#: distance to the nearer of the two pushes' weights. An engine that holds a mix of the two (part of the weights
#: landed) is nearer one of them by at most half the step; on SmolLM2 a bfloat16 engine's grown noise left steps at
#: most 0.55x it (docs/evidence/benchmarks.md, "The rule's margins").
VISIBLE = 1.0
#: When the step is hidden in the noise, the run still stops if the engine is this many times nearer the probe's
#: weights or the last passed check's than the pushed ones: no push landed since those.
STALE = 2.0
#: A calibrated noise above this many times the tolerance's floor means the engine holds other weights (float32:
#: above 2e-4, 5x the largest healthy noise measured).
NOISE_LIMIT = 20


class WeightPushError(RuntimeError):
    """A weight push did not land: the engine's log-probs of the probe are not the trainer's."""


@dataclass
class Expected:
    """The trainer's probe log-probs under the weights of one push (computed when the push is prepared)."""

    step: int
    """The weights version (``trainer.global_step`` of the push)."""
    logp: list[Tensor]
    """One [len(seq) - 1] tensor per probe sequence."""
    without_adapter: list[Tensor] | None = None
    """The policy's with its LoRA adapter switched off (adapter pushes only)."""


class PushCheck:
    """Verifies weight pushes on a probe (see the module docstring).

    Args:
        every: check the first push after the probe is taken, then every ``every``-th; 0 = never.
        tolerance: replaces the calibrated tolerance (``max(TOLERANCES, NOISE_MULTIPLE * noise)``); None = keep it.
        adapter: pushes hand the engine a LoRA adapter (``rollout.weight_sync.lora: adapter``): a failed check
            is also compared with the policy without its adapter.
    """

    def __init__(self, every: int, tolerance: float | None = None, adapter: bool = False) -> None:
        self.every, self.tolerance, self.adapter = every, tolerance, adapter
        self.probe: list[list[int]] | None = None
        self.noise: float | None = None  # the calibrated healthy mean |dlogp| (None until measured)
        self.floor = TOLERANCES[torch.float32]  # the tolerance's floor of the run's precision (set with the probe)
        self.pushes = 0  # pushes seen since the probe was taken
        self.blind = False  # a check passed because its step was hidden in the noise (warned once)
        self.seconds = 0.0  # time spent checking since the last `take_seconds`
        self._history: list[Expected] = []  # the probe's first scores, then the last check that passed
        self._previous: Expected | None = None  # the trainer's scores under the last push prepared with them

    # ---------------------------------------------------------------------------- probe
    def take_probe(self, module, batch: Any, engine: RolloutEngine, step: int, calibrate: bool = True) -> None:
        """Keep the first rows of ``batch`` (the run's first rollout, sampled by ``engine`` with weights version
        ``step``, which the trainer still holds) as the probe, record the trainer's log-probs of it and, with
        ``calibrate``, the engine's noise (`calibrate`; else call it before the next push lands). No-op once
        taken, or when the check is off. ``batch``: anything with ``input_ids`` and ``attention_mask``."""
        if self.every == 0 or self.probe is not None:
            return
        start = time.perf_counter()
        limit = PROBE_TOKENS if engine.max_model_len is None else min(PROBE_TOKENS, engine.max_model_len - 1)
        probe = []
        for row in range(min(PROBE_ROWS, len(batch.input_ids))):
            ids = batch.input_ids[row][batch.attention_mask[row].bool()].tolist()  # prompt + completion, no padding
            if len(ids) >= 2:
                probe.append(ids[:limit])
        if probe:
            self.probe = probe
            trainer = module.attached_trainer
            precision = str(trainer.precision) if trainer is not None else ""
            self.floor = (
                self.tolerance if self.tolerance is not None else tolerance_for(engine, module.policy, precision)
            )
            self._previous = self.expect(module, step)
            self._history = [self._previous]
            if calibrate:
                self.calibrate(engine)
        self.seconds += time.perf_counter() - start

    def calibrate(self, engine: RolloutEngine) -> None:
        """Measure the healthy noise: score the probe on ``engine``, which must still hold the weights the probe
        was taken with; raise `WeightPushError` when it holds other weights (no-op once measured)."""
        if self.probe is None or self.noise is not None:
            return
        expected = self._history[0]
        gaps = {copy: (mean_gap(scores, expected.logp), scores) for copy, scores in engine.score(self.probe).items()}
        copy, (noise, scores) = max(gaps.items(), key=lambda item: item[1][0])
        if not noise <= NOISE_LIMIT * self.floor:
            detail = f"(when the probe was taken; at most {NOISE_LIMIT} x {self.floor:g} is noise)"
            raise WeightPushError(self._diagnosis(engine, copy, scores, expected, noise, detail, None))
        self.noise = noise

    def reset(self) -> None:
        """Forget the probe and the noise (a new fit takes its own)."""
        self.probe, self.noise, self.pushes, self._history, self._previous = None, None, 0, [], None
        self.blind = False

    # ------------------------------------------------------------------------- the check
    def after_push(self, engine: RolloutEngine, module, step: int) -> None:
        """`prepare` and `verify` the push of weights version ``step`` into ``engine`` (when it is checked)."""
        start = time.perf_counter()
        judged = self.prepare(module, step)
        if judged is not None:
            self.verify(engine, *judged)
        self.seconds += time.perf_counter() - start

    def prepare(self, module, step: int) -> tuple[Expected, Expected] | None:
        """The trainer's side of the push of weights version ``step`` (before it lands, on the trainer's thread):
        count it (`due`); when it is checked, return the trainer's scores under its weights and under the
        previous push's, for `verify`. At the push before a check, keep its scores for that check."""
        checked = self.due()
        before_check = self.probe is not None and self.every > 0 and self.pushes % self.every == 0
        if not (checked or before_check):
            return None
        expected, previous = self.expect(module, step), self._previous
        self._previous = expected
        return (expected, previous) if checked else None

    def take_seconds(self) -> float:
        """Seconds spent checking since the last call."""
        seconds, self.seconds = self.seconds, 0.0
        return seconds

    def due(self) -> bool:
        """Count a push; True when this one is checked."""
        if self.every == 0 or self.probe is None:
            return False
        self.pushes += 1
        return (self.pushes - 1) % self.every == 0

    def current_tolerance(self) -> float:
        """``tolerance`` when set, else ``max(floor, NOISE_MULTIPLE * noise)``."""
        if self.tolerance is not None:
            return self.tolerance
        return max(self.floor, NOISE_MULTIPLE * (self.noise or 0.0))

    def expect(self, module, step: int) -> Expected:
        """The trainer's log-probs of the probe under the policy's current weights (weights version ``step``)."""
        batch = probe_batch(self.probe, module.device)
        logp = _rows(module.forward_logprobs(module.policy, batch), self.probe)
        base = None
        if self.adapter:
            with module.policy.disable_adapter():
                base = _rows(module.forward_logprobs(module.policy, batch), self.probe)
        return Expected(step, logp, base)

    def verify(self, engine: RolloutEngine, expected: Expected, previous: Expected) -> None:
        """Score the probe on ``engine`` and raise `WeightPushError` (one line) unless every copy of its weights
        passes `judge` against ``expected`` (the pushed weights'), ``previous`` (the previous push's) and the
        earlier scores kept (the probe's, the last passed check's)."""
        tolerance = self.current_tolerance()
        step_gap = mean_gap(expected.logp, previous.logp)  # how far the step moved the probe
        for copy, scores in engine.score(self.probe).items():
            gaps = Gaps(
                new=mean_gap(scores, expected.logp),
                old=mean_gap(scores, previous.logp),
                step=step_gap,
                earlier=min((mean_gap(scores, e.logp) for e in self._history), default=float("inf")),
            )
            verdict = judge(gaps, tolerance, NOISE_LIMIT * self.floor)
            if verdict == "failed":
                detail = (
                    f"({self._explain(tolerance)}) and by {gaps.old:.3g} under step {previous.step}'s (a push that "
                    f"landed is {CLOSER}x nearer the pushed weights)"
                )
                raise WeightPushError(self._diagnosis(engine, copy, scores, expected, gaps.new, detail, previous))
            if verdict == "hidden" and not self.blind:
                self.blind = True
                warnings.warn(
                    f"weight push check at step {expected.step}: the engine's log-probs of the probe differ from the "
                    f"trainer's by {gaps.new:.3g} ({self._explain(tolerance)}) while the step moved them by "
                    f"{step_gap:.3g}: at this precision the check cannot tell a dropped push from the engine's "
                    "rounding, and stops the run only if the engine holds its last passed check's weights or older, or "
                    "is farther from the trainer's than any noise",
                    stacklevel=2,
                )
        self._history = [self._history[0], expected] if self._history else [expected]

    def _explain(self, tolerance: float) -> str:
        """Where ``tolerance`` comes from, for the error."""
        if self.tolerance is not None:
            return f"tolerance {tolerance:.3g}, rollout.weight_sync.check_tolerance"
        if self.noise is not None and NOISE_MULTIPLE * self.noise > self.floor:
            return f"tolerance {tolerance:.3g}: {NOISE_MULTIPLE} x the noise {self.noise:.3g} measured with the probe"
        return f"tolerance {tolerance:.3g}"

    def _diagnosis(
        self,
        engine: RolloutEngine,
        copy: str,
        scores: list[Tensor],
        expected: Expected,
        gap: float,
        detail: str,
        previous: Expected | None,
    ) -> str:
        """The error's line: ``gap`` (and its ``detail``), then which weights ``scores`` match: an older push's
        (the probe's, the last check that passed, ``previous``), the policy without its adapter, or none."""
        head = (
            f"weight push check: {type(engine).__name__} ({copy}) at step {expected.step} does not sample with the "
            f"pushed weights: its log-probs of the probe differ from the trainer's by mean |dlogp| {gap:.3g} {detail}"
        )
        older = {e.step: e.logp for e in [*self._history, *([previous] if previous else [])] if e.step != expected.step}
        candidates = [(f"step {step}", logp) for step, logp in sorted(older.items())]
        if expected.without_adapter is not None:
            candidates.append(("no adapter", expected.without_adapter))
        gaps = sorted((mean_gap(scores, logp), name) for name, logp in candidates)
        if gaps and (gaps[0][0] <= self.current_tolerance() or gaps[0][0] * CLOSER <= gap):
            closest, name = gaps[0]
            if name == "no adapter":
                return (
                    f"{head}; they match the policy without its LoRA adapter ({closest:.3g}): the adapter's modules "
                    "are missing (adapter not loaded)"
                )
            return f"{head}; they match {name}'s weights ({closest:.3g}): the engine still holds {name}'s weights (no layer was updated)"
        return (
            f"{head}; they match no earlier weights: part of the weights did not land (a tensor skipped, renamed "
            "or rounded away)"
        )


@dataclass(frozen=True)
class Gaps:
    """One copy of the engine's weights at a check: mean |dlogp| on the probe."""

    new: float
    """To the trainer's scores under the pushed weights (d_new)."""
    old: float
    """To the trainer's scores under the previous push's weights (d_old)."""
    step: float
    """Between the trainer's scores under the two: how far the step moved the probe (d_step)."""
    earlier: float
    """To the nearest of the earlier scores kept: the probe's and the last passed check's."""


#: What `judge` says of one copy of the engine's weights at a check.
Verdict = Literal["landed", "hidden", "failed"]


def judge(gaps: Gaps, tolerance: float, noise_limit: float) -> Verdict:
    """The rule of a check (see the module docstring): "landed" (within ``tolerance``, or `CLOSER` times nearer
    the pushed weights than the previous push's), "failed" (a visible step the engine did not follow, an engine
    `STALE` times nearer earlier weights, or one farther than ``noise_limit``, which no noise reaches), or
    "hidden" (a step the engine's noise hides: passes)."""
    if gaps.new <= tolerance or gaps.new * CLOSER <= gaps.old:
        return "landed"
    visible = gaps.step >= VISIBLE * min(gaps.new, gaps.old)
    if visible or gaps.earlier * STALE <= gaps.new or gaps.new > noise_limit:
        return "failed"
    return "hidden"


def tolerance_for(engine: RolloutEngine, policy: nn.Module, precision: str) -> float:
    """`TOLERANCES` of the least precise of the engine's dtype, the policy's floating parameters and the
    Trainer's ``precision`` ("32-true", "bf16-mixed", ...)."""
    dtypes = {p.dtype for p in policy.parameters() if p.is_floating_point()}
    if engine.dtype is not None:
        dtypes.add(engine.dtype)
    if "bf16" in precision:
        dtypes.add(torch.bfloat16)
    elif "16" in precision:
        dtypes.add(torch.float16)
    return max(TOLERANCES.get(d, TOLERANCES[torch.bfloat16]) for d in dtypes or {torch.float32})


def probe_batch(probe: list[list[int]], device: torch.device) -> RolloutBatch:
    """The probe as a `RolloutBatch` whose 'prompt' is each sequence's first token and whose 'completion' (all
    scored) is the rest, right-padded; temperature 1."""
    width = max(len(s) for s in probe)
    ids = torch.zeros((len(probe), width), dtype=torch.long)  # [S, 1 + Lc]
    mask = torch.zeros_like(ids)  # [S, 1 + Lc]
    for i, seq in enumerate(probe):
        ids[i, : len(seq)], mask[i, : len(seq)] = torch.tensor(seq), 1
    completion_mask = mask[:, 1:].float()  # [S, Lc]
    batch = RolloutBatch(
        input_ids=ids,
        attention_mask=mask,
        completion_mask=completion_mask,
        advantages=torch.zeros(len(probe)),
        rollout_logp=torch.zeros_like(completion_mask),
        prompt_length=1,
        group_size=1,
        temperature=1.0,
    )
    return batch.to(device)


def mean_gap(a: list[Tensor], b: list[Tensor]) -> float:
    """Mean |a - b| over every token of every sequence."""
    diffs = torch.cat([(x.float().cpu() - y.float().cpu()).abs() for x, y in zip(a, b)])
    return float(diffs.mean())


def _rows(logp: Tensor, probe: list[list[int]]) -> list[Tensor]:
    """[S, Lc] padded log-probs -> one [len(seq) - 1] tensor per sequence (float32, CPU)."""
    return [logp[i, : len(seq) - 1].float().cpu() for i, seq in enumerate(probe)]
