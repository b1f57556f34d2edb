"""EngineLink: the rollout callback's engine, from the first use to teardown.

It holds the engine (built by the callback on first use, or handed over with ``use_engine``), keeps its weights in
step with the policy (the push, :class:`~.weight_push.PolicyPush`, and the push check,
:class:`~.push_check.PushCheck`; the asynchronous pipeline's two halves of a push, `prepare_push` and `send_push`),
and closes it at teardown when it built it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import lightning as L

from ..rollout.base import RolloutEngine
from .push_check import PushCheck
from .settings import WeightSyncSettings
from .weight_push import PolicyPush


class EngineLink:
    """The engine of a :class:`~lightning_grpo.callbacks.rollout.RolloutCallback` and its weight sync (see the
    module docstring)."""

    def __init__(self, weight_sync: WeightSyncSettings) -> None:
        self.weight_sync = weight_sync
        self._push = PolicyPush(weight_sync.lora)
        self._check = PushCheck(weight_sync.check_every, weight_sync.check_tolerance, weight_sync.lora == "adapter")
        self.engine: RolloutEngine | None = None
        self._owned = False  # built here (closed at teardown), not handed over
        self._version = -1  # the trainer.global_step (optimizer steps) the engine's weights reflect

    def use(self, engine: RolloutEngine) -> None:
        """Sample with ``engine`` (not closed at teardown); its weights are pushed before the first generation."""
        self.engine, self._owned, self._version = engine, False, -1

    def ensure(self, build: Callable[[], RolloutEngine]) -> RolloutEngine:
        """The engine, built by ``build`` on first use."""
        if self.engine is None:
            self.engine = build()
            self._owned = True
        return self.engine

    def sync(self, module: L.LightningModule) -> float:
        """Push the policy into the engine if it changed since the last push, then check the push when due
        (``rollout.weight_sync.check_every``; an engine on the live policy is checked when the policy changed);
        returns the push's seconds."""
        step = module.trainer.global_step
        if not self.engine.needs_weight_sync:
            if self._version != step:
                self._version = step
                self._check.after_push(self.engine, module, step)
            return 0.0
        stale = self._version != step and (self.weight_sync.enabled or self._version < 0)
        if not stale and not self.engine.weights_discarded:  # (sleep level 2 dropped them: push anyway)
            return 0.0
        start = time.perf_counter()
        self._push(self.engine, module.policy, step, first=self._version < 0)
        self._version = step
        seconds = time.perf_counter() - start
        self._check.after_push(self.engine, module, step)  # raises WeightPushError when the push did not land
        return seconds

    def take_probe(self, module: L.LightningModule, tensors: Any, step: int, calibrate: bool = True) -> None:
        """Keep a probe of the fresh batch for the push check (`PushCheck.take_probe`)."""
        self._check.take_probe(module, tensors, self.engine, step, calibrate=calibrate)

    def check_seconds(self) -> float:
        """Seconds the push check took since the last call (``time/push_check``)."""
        return self._check.take_seconds()

    # ------------------------------------------------------ the asynchronous pipeline's push
    def prepare_push(self, module: L.LightningModule, step: int) -> tuple[Any, Any]:
        """The trainer's half of a push: the engine's payload of the policy's weights at ``step`` and the push
        check's expectation."""
        from ..models.weights import gathered_weights_for_engine

        self._version = step
        with gathered_weights_for_engine(module.policy) as weights:  # snapshot taken inside (FSDP2: gathered)
            payload = self.engine.prepare_push(weights)
        return payload, self._check.prepare(module, step)  # the trainer's side of the push check

    def send_push(self, prepared: tuple[Any, Any], step: int) -> None:
        """The worker's half: send a prepared push, then check it when due."""
        self._check.calibrate(self.engine)  # the first push after the probe: the engine holds its weights still
        self.engine.send_push(prepared[0], step)
        if prepared[1] is not None:
            self._check.verify(self.engine, *prepared[1])

    # ---------------------------------------------------------------------------- end
    def close(self) -> None:
        """Close an engine built here (a handed-over one only unloads our adapter) and forget the pushed version."""
        if self.engine is not None and self._owned:
            self.engine.close()
            self.engine = None
        elif self.engine is not None and self.weight_sync.lora == "adapter":  # a user's engine: without our adapter
            self.engine.unload_lora_adapter()
        self._push.close()
        self._check.reset()
        self._version = -1

    def push_again(self) -> None:
        """Push before the next generation whatever the engine holds (a resumed run)."""
        self._version = -1
