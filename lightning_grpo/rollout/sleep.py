"""Sleep mode of a colocated vLLM engine: give the GPU back to the trainer between generations.

An in-process engine keeps its weights and its KV cache on the GPU while the trainer computes
log-probs and gradients next to it. vLLM's sleep mode (``LLM(enable_sleep_mode=True)``) releases
that memory; TRL (``vllm_enable_sleep_mode``), verl (``free_cache_engine``) and OpenRLHF
(``vllm.enable_sleep``) use it the same way. :class:`EngineSleep` makes the calls in the order
vLLM requires, one generation batch at a time:

    generate -> sleep(level)                      (the trainer trains with the memory freed)
    -> wake_up(["weights"]) -> weight push -> wake_up(["kv_cache"]) -> generate -> sleep ...

Level 1 offloads the weights to CPU memory and drops the KV cache; level 2 drops both, so the
weights must be pushed again before the next generation (the push after every optimizer step
does it; :attr:`EngineSleep.weights_discarded` tells the caller to push even when the policy did
not change). Waking the weights before the push and the KV cache only after it keeps the peak
at weights + push buffers, never weights + KV cache + push buffers.

On CPU vLLM has no sleep mode: ``sleep`` / ``wake_up`` only pause and resume its scheduler and
free nothing (docs: platform notes), but the calls and their order are the same, which is what
the tests check there.
"""

from __future__ import annotations

from typing import Any

from lightning_grpo.rollout.engine_settings import ENGINE_ARGS

SLEEP_LEVELS = (0, 1, 2)


class EngineSleep:
    """The sleep state of one ``vllm.LLM`` and the calls that move it (see the module docstring).

    Args:
        level: 0 = never sleep; 1 = offload the weights to CPU memory and drop the KV cache;
            2 = drop both (the weights must be pushed again before the next generation).
    """

    def __init__(self, level: int) -> None:
        if level not in SLEEP_LEVELS:
            raise ValueError(f"{ENGINE_ARGS}.sleep_level must be 0 (off), 1 or 2, got {level!r}")
        self.level = level
        self.asleep = False
        """Some of the engine's memory is released (set by :meth:`sleep`, cleared by :meth:`before_generate`)."""
        self.weights_awake = True
        """The weights are resident (always True while awake)."""
        self.weights_discarded = False
        """Level 2 dropped the weights and no push has refilled them yet."""

    def sleep(self, llm: Any) -> None:
        """Release the engine's memory (no-op at level 0 or when already asleep)."""
        if self.level == 0 or self.asleep:
            return
        llm.sleep(level=self.level)
        self.asleep, self.weights_awake = True, False
        self.weights_discarded = self.level == 2

    def before_push(self, llm: Any) -> None:
        """Bring the weights back (only the weights) so a push can write into them."""
        if self.asleep and not self.weights_awake:
            llm.wake_up(tags=["weights"])
            self.weights_awake = True

    def after_push(self) -> None:
        self.weights_discarded = False

    def before_generate(self, llm: Any) -> None:
        """Wake whatever sleeps (the KV cache; the weights too when no push came in between)."""
        if not self.asleep:
            return
        if self.weights_discarded:
            raise RuntimeError(
                "the vLLM engine slept at level 2 (rollout.engine.init_args.sleep_level: 2), which discards its weights, and no "
                "weights were pushed since: push them (load_weights) before generating, or use sleep_level: 1"
            )
        llm.wake_up(tags=["kv_cache"] if self.weights_awake else None)
        self.asleep, self.weights_awake = False, True
