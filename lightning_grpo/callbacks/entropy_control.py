"""EntropyController: hold the policy's token entropy in a band by moving one loss knob.

Entropy must be *held* between collapse and explosion, with Clip-Higher,
Clip-Cov / KL-Cov or an entropy bonus, and that these knobs interact. The controller moves one
of them, chosen by name, after each optimizer step (for the next one):

    H = mean of train/entropy over the last ``window`` steps (since the last move)
    H < floor    -> knob up   (more entropy)     H > ceiling -> knob down
    otherwise    -> unchanged

After a move the window starts afresh, so the next decision sees ``window`` steps trained with
the new value (at most one move per ``window`` steps; no wind-up while the entropy responds).

Every knob raises the entropy when it grows: ``entropy_coef`` (the bonus -c * H), ``eps_high``
(Clip-Higher lets low-probability tokens gain more), ``clip_ratio`` (Clip-Cov: more
high-covariance tokens left out of the gradient) and ``kl_cov_ratio`` (KL-Cov: more tokens
pulled back). A move is bounded: one ``step`` (added, or a factor for the ratios), clamped to
``[low, high]``. The knob is set through the loss (`GRPOLoss.set_knob`), its value logged
as ``entropy_control/<knob>`` and kept in checkpoints. Under DDP rank 0 decides and broadcasts,
so every rank trains with the same value.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

import lightning as L
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from ..core import GRPOLoss
from ..training.metrics import hands_step_metrics_over


@runtime_checkable
class LossHolder(Protocol):
    """A module that trains with a loss whose knobs the controller moves (`GRPOModule`)."""

    loss_fn: Any  # a GRPOLoss (checked in setup)


@dataclass(frozen=True)
class KnobRange:
    """How a knob moves: ``step`` added (or, ``factor``, multiplied), kept within [low, high]."""

    step: float
    low: float
    high: float
    factor: bool = False  # multiply / divide by ``step`` instead of adding / subtracting it

    def move(self, value: float, direction: int) -> float:
        if self.factor:
            value = value * self.step**direction if value > 0 else self.low
        else:
            value = value + direction * self.step
        return min(self.high, max(self.low, value))


#: Default movement per knob (override with ``step`` / ``low`` / ``high``).
KNOB_RANGES: dict[str, KnobRange] = {
    "entropy_coef": KnobRange(step=0.005, low=0.0, high=0.1),
    "eps_high": KnobRange(step=0.02, low=0.2, high=0.4),
    "clip_ratio": KnobRange(step=2.0, low=2e-4, high=2e-2, factor=True),
    "kl_cov_ratio": KnobRange(step=2.0, low=2e-4, high=2e-2, factor=True),
}


class EntropyController(Callback):
    """Hold ``train/entropy`` in ``[floor, ceiling]`` by moving one knob of the loss.

    Args:
        knob: "entropy_coef", "eps_high", "clip_ratio" (policy_loss clip_cov) or "kl_cov_ratio"
            (kl_cov); the configured policy loss must have it (checked before training).
        floor: raise the knob while the windowed entropy is below it.
        ceiling: lower the knob while the windowed entropy is above it (None: never lowered).
        window: steps whose entropy is averaged before deciding (1 = the last step only).
        step: override the knob's move per window (`KNOB_RANGES`).
        low: the knob's lowest value; by default its configured value (never moved below it).
        high: the knob's highest value (`KNOB_RANGES`).

    Example:
        ```python
        import lightning as L
        from lightning_grpo import EntropyController

        # hold train/entropy above 0.3 by moving the entropy bonus
        trainer = L.Trainer(callbacks=[EntropyController(knob="entropy_coef", floor=0.3)])
        ```
    """

    def __init__(
        self,
        knob: str = "entropy_coef",
        floor: float = 0.3,
        ceiling: float | None = None,
        window: int = 5,
        step: float | None = None,
        low: float | None = None,
        high: float | None = None,
    ) -> None:
        if knob not in KNOB_RANGES:
            raise ValueError(f"EntropyController.knob must be one of {', '.join(KNOB_RANGES)}; got {knob!r}")
        if not (math.isfinite(floor) and floor >= 0):
            raise ValueError(f"EntropyController.floor must be finite and >= 0, got {floor}")
        if ceiling is not None and not ceiling > floor:
            raise ValueError(f"EntropyController.ceiling must be > floor ({floor}), got {ceiling}")
        if window < 1:
            raise ValueError(f"EntropyController.window must be >= 1, got {window}")
        base = KNOB_RANGES[knob]
        self.range = KnobRange(
            step=base.step if step is None else step,
            low=base.low if low is None else low,
            high=base.high if high is None else high,
            factor=base.factor,
        )
        if self.range.step <= (1.0 if self.range.factor else 0.0) or not self.range.low <= self.range.high:
            raise ValueError(
                f"EntropyController: need step > {1 if self.range.factor else 0} and low <= high, got {self.range}"
            )
        self._low_given = low is not None
        self.knob, self.floor, self.ceiling, self.window = knob, floor, ceiling, window
        self.entropies: deque[float] = deque(maxlen=window)
        self.value: float | None = None  # the knob's value now (None until the fit starts)
        self.moves = 0  # adjustments so far
        self._restored: float | None = None

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(knob=self.knob)

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        loss = pl_module.loss_fn if isinstance(pl_module, LossHolder) else None
        if not isinstance(loss, GRPOLoss):
            raise ValueError("EntropyController needs a GRPOModule whose loss is a lightning_grpo.GRPOLoss")
        if self.knob not in loss.knobs():
            raise ValueError(
                f"EntropyController.knob {self.knob!r} does not apply to this loss (its knobs: {', '.join(loss.knobs())}); "
                "eps_high needs a clipping policy loss, clip_ratio policy_loss clip_cov, kl_cov_ratio kl_cov"
            )

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._restored is not None:  # a resumed run continues with the value it had
            pl_module.loss_fn.set_knob(self.knob, self._restored)
            self._restored = None
        self.value = pl_module.loss_fn.knob(self.knob)
        if not self._low_given:  # never below what the run was configured with
            self.range = replace(self.range, low=min(self.value, self.range.high))

    @override
    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        entropy = pl_module.step_metrics.compute().get("entropy")
        if entropy is not None and math.isfinite(entropy):
            self.entropies.append(entropy)
        direction = self.decide()
        if trainer.world_size > 1:  # one decision for every rank
            direction = int(trainer.strategy.broadcast(direction, src=0))
        if direction:
            self.value = self.range.move(self.value, direction)
            pl_module.loss_fn.set_knob(self.knob, self.value)
            self.moves += 1
            self.entropies.clear()  # judge the new value on steps trained with it
        if direction or hands_step_metrics_over(trainer):  # a move always; otherwise where the loggers write
            pl_module.log(f"entropy_control/{self.knob}", self.value, on_step=True, on_epoch=False, batch_size=1)
            pl_module.log("entropy_control/direction", float(direction), on_step=True, on_epoch=False, batch_size=1)

    def decide(self) -> int:
        """+1 (raise the knob), -1 (lower it) or 0, from the mean entropy of a full window."""
        if len(self.entropies) < self.window:
            return 0
        mean = sum(self.entropies) / len(self.entropies)
        if mean < self.floor and self.value < self.range.high:
            return 1
        if self.ceiling is not None and mean > self.ceiling and self.value > self.range.low:
            return -1
        return 0

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value, "moves": self.moves, "entropies": list(self.entropies)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._restored = state_dict["value"]
        self.moves = int(state_dict["moves"])
        self.entropies = deque(state_dict["entropies"], maxlen=self.window)
