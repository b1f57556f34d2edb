"""Does an optimizer step move weights stored in a 16-bit float?

bfloat16 keeps 8 significant bits: a weight of 0.05 sits between neighbours 2.4e-4 apart, so an update smaller
than half that (1.2e-4) rounds back to the weight it started from. Full fine-tuning of a pretrained model at lr
1e-5 with the weights themselves in bfloat16 (``trainer.precision: bf16-true``) therefore leaves nearly every
weight where it was (98% of SmolLM2-135M's 134.5M; 84% at 1e-4, 1% at 1e-3): the run samples, scores and back-propagates, and the policy does not learn (SmolLM2-135M on
chain_sum: training reward 0.06-0.20 over 23 steps where float32 weights reach 0.89 by step 11). Mixed precision
(``bf16-mixed``) keeps float32 weights and computes in bfloat16, and has no such floor.

:func:`rounded_away_share` measures it: the share of an optimizer's trainable elements that a step of the learning
rate away from zero leaves unchanged, per parameter group, on the stored weights. :func:`rounded_away_warning`
turns a large share into one line that names the fix. Only 16-bit floating weights are read (float32 runs cost
nothing); an optimizer that rounds stochastically or keeps its own float32 copy has no such floor, which is why this
is a warning and not an error.
"""

from __future__ import annotations

import torch

#: Stored dtypes whose spacing can swallow a learning-rate step.
LOW_PRECISION = (torch.bfloat16, torch.float16)
#: Warn when a step of the learning rate leaves at least this share of the low-precision trainable elements as
#: they were (LoRA's adapters start at or near zero, where steps land: their share stays far below).
WARN_SHARE = 0.5


@torch.no_grad()
def rounded_away_share(optimizer: torch.optim.Optimizer) -> tuple[float, int, float, torch.dtype] | None:
    """``(share, elements, lr, dtype)`` over the optimizer's 16-bit floating parameters: the share of their elements
    ``w`` for which ``|w| + lr`` (computed in float32) rounds back to ``|w|`` in the stored dtype, the number of
    such elements, the smallest learning rate of their groups and the first one's dtype; None when no parameter is stored in 16 bits
    or a group's learning rate is not a positive number."""
    unchanged = total = 0
    smallest = float("inf")
    dtype = None
    for group in optimizer.param_groups:
        lr = group.get("lr")
        low = [p for p in group["params"] if p.dtype in LOW_PRECISION]
        if not low:
            continue
        if not isinstance(lr, (int, float, torch.Tensor)) or not float(lr) > 0:
            return None
        lr = float(lr)
        smallest = min(smallest, lr)
        dtype = dtype or low[0].dtype
        for p in low:
            magnitude = p.detach().abs()  # [*p.shape]
            unchanged += int(((magnitude.float() + lr).to(p.dtype) == magnitude).sum())
            total += p.numel()
    return (unchanged / total, total, smallest, dtype) if total else None


def rounded_away_warning(optimizer: torch.optim.Optimizer) -> str | None:
    """One line when a step of the learning rate leaves at least :data:`WARN_SHARE` of the 16-bit trainable
    weights unchanged (see the module docstring); None otherwise."""
    found = rounded_away_share(optimizer)
    if found is None or found[0] < WARN_SHARE:
        return None
    share, elements, lr, dtype = found
    name = str(dtype).removeprefix("torch.")
    return (
        f"the policy's trainable weights are stored in {name}, where a step of the learning rate ({lr:g}) rounds "
        f"away for {share:.0%} of their {elements:,} elements: the policy will barely change. Keep them in float32 "
        "(--trainer.precision bf16-mixed computes in bfloat16 on float32 weights; model.policy.dtype float32) or "
        "use an optimizer that rounds stochastically"
    )
