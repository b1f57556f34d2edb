"""The weight push check: after a push, does the engine sample with the weights the trainer pushed?

A push can fail without an error: a LoRA adapter never applied, parameter names that no longer match after
a library upgrade, a weight skipped or rounded away. The engine then keeps sampling from older weights, and
the only trace is a train-inference mismatch that bf16 noise also produces. The check makes it a hard stop.

The probe: the first `PROBE_ROWS` prompt + completion sequences of the run's first rollout batch, cut to
their first `PROBE_TOKENS` tokens (and below the engine's ``max_model_len``). After a push the engine scores
the probe (`RolloutEngine.score`: log-probs of the given tokens at temperature 1, each copy of its weights
apart) and the trainer scores it with the policy through the training forward (`GRPOModule.forward_logprobs`).
The mean |difference| over the probe's tokens must stay within the tolerance of the run's precision
(`TOLERANCES`, or ``rollout.weight_sync.check_tolerance``). When it does not, the engine's log-probs are also
compared with those the trainer recorded for older weights (at the last check that passed and when the probe
was taken) and, for a LoRA adapter push, with the policy's with the adapter switched off, and the error
says which one they match: all layers stale, the adapter missing, or neither (part of the weights).

Healthy float32 pushes measured on CPU (docs/evidence/benchmarks.md, "Weight push check"): mean |dlogp| at most
2.2e-7 on the quickstart model and 2.3e-7 on the 9.7M model at 512-token prompts (largest single token 9.5e-7):
the float32 tolerance 1e-5 leaves a margin of over 40x. The bf16 and fp16 tolerances were not measured here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..core.batch import RolloutBatch
from ..rollout.base import RolloutEngine

#: Rows of the first rollout batch kept as the probe.
PROBE_ROWS = 2
#: Longest probe sequence, in tokens.
PROBE_TOKENS = 64
#: Tolerated mean |log-prob difference| on the probe, by the least precise dtype of the run.
TOLERANCES = {torch.float32: 1e-5, torch.float64: 1e-5, torch.float16: 1e-2, torch.bfloat16: 5e-2}


class WeightPushError(RuntimeError):
    """A weight push did not land: the engine's log-probs of the probe are not the trainer's."""


@dataclass
class Expected:
    """The trainer's probe log-probs under the weights of one push (computed when the push is prepared)."""

    step: int
    logp: list[Tensor]  # one [len(seq) - 1] tensor per probe sequence
    without_adapter: list[Tensor] | None = None  # the policy's with its LoRA adapter switched off (adapter pushes)


class PushCheck:
    """Verifies weight pushes on a probe (see the module docstring).

    Args:
        every: check the first push after the probe is taken, then every ``every``-th; 0 = never.
        tolerance: the largest mean |dlogp| that passes; None = `TOLERANCES` of the run's precision.
        adapter: pushes hand the engine a LoRA adapter (``rollout.weight_sync.lora: adapter``): a failed check
            is also compared with the policy without its adapter.
    """

    def __init__(self, every: int, tolerance: float | None = None, adapter: bool = False) -> None:
        self.every, self.tolerance, self.adapter = every, tolerance, adapter
        self.probe: list[list[int]] | None = None
        self.pushes = 0  # pushes seen since the probe was taken
        self.seconds = 0.0  # time spent checking since the last `take_seconds`
        self._history: list[Expected] = []  # the probe's first scores, then the last check that passed

    # ---------------------------------------------------------------------------- probe
    def take_probe(self, module, batch: RolloutBatch, max_model_len: int | None, step: int) -> None:
        """Keep the first rows of ``batch`` (the run's first rollout, sampled with weights version ``step``) as
        the probe and record the trainer's log-probs of it under those weights (no-op once taken, or when the
        check is off)."""
        if self.every == 0 or self.probe is not None:
            return
        limit = PROBE_TOKENS if max_model_len is None else min(PROBE_TOKENS, max_model_len - 1)
        probe = []
        for row in range(min(PROBE_ROWS, len(batch))):
            ids = batch.input_ids[row][batch.attention_mask[row].bool()].tolist()  # prompt + completion, no padding
            if len(ids) >= 2:
                probe.append(ids[:limit])
        if probe:
            self.probe = probe
            self._history = [self.expect(module, step)]

    def reset(self) -> None:
        """Forget the probe (a new fit takes its own)."""
        self.probe, self.pushes, self._history = None, 0, []

    # ------------------------------------------------------------------------- the check
    def after_push(self, engine: RolloutEngine, module, step: int) -> None:
        """Check the push of weights version ``step`` into ``engine`` when it is due (`due`)."""
        if self.due():
            start = time.perf_counter()
            self.verify(engine, self.expect(module, step), self.tolerance_of(engine, module))
            self.seconds += time.perf_counter() - start

    def tolerance_of(self, engine: RolloutEngine, module) -> float:
        """``tolerance``, or the one of the run's precision (`tolerance_for`)."""
        if self.tolerance is not None:
            return self.tolerance
        return tolerance_for(engine, module.policy, str(module.trainer.precision))

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

    def expect(self, module, step: int) -> Expected:
        """The trainer's log-probs of the probe under the policy's current weights (weights version ``step``)."""
        batch = probe_batch(self.probe, module.device)
        logp = _rows(module.forward_logprobs(module.policy, batch), self.probe)
        base = None
        if self.adapter:
            with module.policy.disable_adapter():
                base = _rows(module.forward_logprobs(module.policy, batch), self.probe)
        return Expected(step, logp, base)

    def verify(self, engine: RolloutEngine, expected: Expected, tolerance: float) -> None:
        """Score the probe on ``engine`` and raise `WeightPushError` (one line) unless every copy of its
        weights gives ``expected`` within ``tolerance``."""
        for copy, scores in engine.score(self.probe).items():
            gap = mean_gap(scores, expected.logp)
            if not gap <= tolerance:
                raise WeightPushError(self._diagnosis(engine, copy, scores, expected, gap, tolerance))
        self._history = [self._history[0], expected] if self._history else [expected]

    def _diagnosis(
        self, engine: RolloutEngine, copy: str, scores: list[Tensor], expected: Expected, gap: float, tolerance: float
    ) -> str:
        head = (
            f"weight push check: {type(engine).__name__} ({copy}) at step {expected.step} does not sample with the "
            f"pushed weights: its log-probs of the probe differ from the trainer's by mean |dlogp| {gap:.3g} "
            f"(tolerance {tolerance:g})"
        )
        candidates = [(f"step {older.step}", older.logp) for older in self._history if older.step != expected.step]
        if expected.without_adapter is not None:
            candidates.append(("no adapter", expected.without_adapter))
        gaps = sorted((mean_gap(scores, logp), name) for name, logp in candidates)
        if gaps and gaps[0][0] <= tolerance:
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
