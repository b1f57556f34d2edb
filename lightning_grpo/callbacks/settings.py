"""The grouped settings of `RolloutCallback` (``rollout.selection``,
``rollout.evaluation``, ``rollout.weight_sync``); the engines' own are
`VLLMArgs` and `ServerSettings`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: Default ``rollout.weight_sync.check_every``: a check costs about a quarter of a quickstart step
#: (docs/evidence/benchmarks.md, "Weight push check"), so every 16th push keeps it under 2% there.
CHECK_EVERY = 16


@dataclass
class SelectionSettings:
    """Which sampled completions train (``rollout.selection``): GFPO, dynamic sampling, the overlong filter."""

    dynamic_sampling: bool = False
    """Drop groups whose rewards are all equal and sample more prompts to refill the batch (DAPO)."""
    dynamic_sampling_reward: str | None = None
    """The reward function (its name / alias) whose spread decides which groups dynamic sampling keeps
    (verl ``filter_groups.metric``, e.g. the accuracy reward when a length penalty is added); None = the
    weighted total."""
    max_generation_rounds: int = 4
    """Generation rounds per batch with dynamic sampling (verl ``max_num_gen_batches``); after that the
    batch trains with what it has."""
    gfpo_keep: int | None = None
    """GFPO: keep this many of the ``rollout.sampling.n`` completions per prompt (None = off)."""
    gfpo_metric: str = "gfpo_length"
    """GFPO's selection (``SELECTIONS``): "gfpo_length" or "gfpo_reward_per_token"."""
    overlong_filter: bool = False
    """Mask the loss of completions truncated without EOS (DAPO)."""

    def __post_init__(self) -> None:
        if not isinstance(self.max_generation_rounds, int) or self.max_generation_rounds < 1:
            raise ValueError(
                f"rollout.selection.max_generation_rounds must be an integer >= 1, got {self.max_generation_rounds!r}"
            )
        if self.gfpo_keep is not None:
            from ..core import SELECTIONS

            if self.gfpo_metric not in SELECTIONS or not self.gfpo_metric.startswith("gfpo"):
                names = sorted(n for n in SELECTIONS.names() if n.startswith("gfpo"))
                raise ValueError(f"rollout.selection.gfpo_metric {self.gfpo_metric!r} is not one of {names}")


@dataclass
class EvaluationSettings:
    """Held-out evaluation (``rollout.evaluation``): greedy accuracy, and n sampled completions per prompt."""

    samples: int = 4
    """n, the sampled completions per held-out prompt for ``val/reward_mean``, ``val/mean@n`` and
    ``val/pass@k`` (0 = greedy accuracy only)."""
    pass_k: list[int] | None = None
    """The k of ``val/pass@k`` (each in 1..n; unbiased estimator); None = [n]."""
    pass_threshold: float = 1.0
    """A sample passes when the first reward function scores it at least this."""

    def __post_init__(self) -> None:
        if not isinstance(self.samples, int) or self.samples < 0:
            raise ValueError(
                f"rollout.evaluation.samples must be an integer >= 0 (0 = greedy only), got {self.samples!r}"
            )
        for k in self.pass_k or []:
            if not isinstance(k, int) or not 1 <= k <= self.samples:
                raise ValueError(
                    f"rollout.evaluation.pass_k: each k must be in 1..rollout.evaluation.samples={self.samples}, got {k!r}"
                )


@dataclass
class WeightSyncSettings:
    """How the policy's weights reach the engine (``rollout.weight_sync``)."""

    enabled: bool = True
    """Push the policy into the engine after optimizer steps. Switch off only to measure the staleness it prevents."""
    lora: Literal["merged", "adapter"] = "merged"
    """A LoRA policy: "merged" pushes W + delta_W as plain weights; "adapter" saves the adapter and lets
    vLLM apply it (needs ``rollout.engine.init_args.lora.enabled`` of `VLLMArgs`)."""
    check_every: int = CHECK_EVERY
    """Check that a push landed (`lightning_grpo.callbacks.push_check`): the engine scores a fixed probe (the
    first rows of the run's first rollout) and its log-probs must equal the trainer's under the pushed weights
    (see ``check_tolerance``); a push that did not land stops the run with one line naming the engine, the step
    and what differs. Runs at the first push after the probe is taken, then at every ``check_every``-th; 0 =
    off. Costs one engine call when the probe is taken, then per check one engine call and one trainer forward
    on a few short sequences, plus one trainer forward at the push before it (none with 1)
    (docs/evidence/benchmarks.md)."""
    check_tolerance: float | None = None
    """Largest mean |log-prob difference| between the engine's and the trainer's scores of the probe that
    passes. None = calibrated: ``max(floor, 4 x noise)``, where the floor comes from the run's precision (the
    least precise of the engine's dtype, the policy's and the Trainer's: float32 1e-5, float16 1e-2, bfloat16
    5e-2) and the noise is that difference measured when the probe is taken, before any push (above 20 x the
    floor, or 20 x this value when set, it stops the run: the engine holds other weights). Either way a push
    also passes when the engine's scores are 100x nearer the pushed weights' than the previous push's (a
    diverging run's noise outgrows any tolerance; its steps outgrow the noise far more)."""

    def __post_init__(self) -> None:
        if self.lora not in ("merged", "adapter"):
            raise ValueError(f"rollout.weight_sync.lora must be 'merged' or 'adapter', got {self.lora!r}")
        if not isinstance(self.check_every, int) or isinstance(self.check_every, bool) or self.check_every < 0:
            raise ValueError(
                f"rollout.weight_sync.check_every must be an integer >= 0 (0 = off), got {self.check_every!r}"
            )
        if self.check_tolerance is not None and not self.check_tolerance > 0:
            raise ValueError(
                f"rollout.weight_sync.check_tolerance must be > 0 (or null: from the precision), got {self.check_tolerance!r}"
            )
