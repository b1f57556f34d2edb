"""PlanSlot: the run plan a rollout callback follows, and the sampling seed it derives.

The command line resolves the plan before ``trainer.fit`` and hands it over (`hand`); without that, the callback's
``setup`` resolves it (`take`). The sampling seed is a resumed run's (`resume`), else ``rollout.seed``, else the
plan's (the run seed).
"""

from __future__ import annotations

from collections.abc import Callable

from ..plan.run_plan import RunPlan


class PlanSlot:
    """The plan of the next or current fit, and the sampling seed (see the module docstring)."""

    def __init__(self, seed: int | None) -> None:
        self.seed = seed  # rollout.seed (None: the run seed)
        self._plan: RunPlan | None = None  # the run's, resolved (or taken over from `hand`) in setup
        self._handed: RunPlan | None = None  # resolved by the command line for the next setup
        self._resumed_seed: int | None = None  # the sampling seed a resumed run's checkpoint holds

    def hand(self, plan: RunPlan) -> None:
        """Run the next fit by ``plan``."""
        self._handed = plan

    def take(self, resolve: Callable[[], RunPlan]) -> RunPlan:
        """The plan of this fit: the handed one, else ``resolve()``'s."""
        self._plan = self._handed or resolve()
        self._handed = None
        return self._plan

    @property
    def plan(self) -> RunPlan:
        """The run plan (resolved in setup)."""
        if self._plan is None:
            raise RuntimeError("RolloutCallback.plan is resolved in setup: trainer.fit(module, datamodule=...)")
        return self._plan

    def resume(self, seed: int) -> None:
        """Sample with the seed a resumed run's checkpoint holds."""
        self._resumed_seed = seed

    @property
    def sampling_seed(self) -> int:
        """A resumed run's seed, else ``rollout.seed`` (set, it needs no plan), else the plan's."""
        if self._resumed_seed is not None:
            return self._resumed_seed
        return self.seed if self._plan is None and self.seed is not None else self.plan.sampling_seed
