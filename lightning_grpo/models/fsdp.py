"""FSDP2 (``torch.distributed.fsdp.fully_shard``) support: sharding the policy, running the chunked
log-prob path as a root forward, and gathering full weights for the rollout engine's push.

- :func:`shard_policy`: under Lightning's ``ModelParallelStrategy`` (data-parallel FSDP2),
  ``GRPOModule.configure_model`` shards each decoder layer, then the whole model (the root unit
  keeps the embeddings, final norm and LM head), for the policy and the frozen reference copy.
- :func:`run_as_forward`: the chunked log-prob path calls ``model.get_decoder()`` and reads the LM
  head weight directly, outside the root ``forward`` where FSDP2 all-gathers the root unit's
  parameters and hooks up their gradient reduce-scatter. FSDP2's own
  ``register_fsdp_forward_method`` makes a method a forward for those hooks; this runs the
  log-prob function through such a method (a plain call when the model is not sharded).
- :func:`gathered`: all-gathers the parameters of every FSDP2 unit (``FSDPModule.unshard``: one
  collective per unit, so the gather is bucketed by unit) for the duration of a weight push, then
  reshards. Every rank must enter it together (it is a collective), as every rank pushes into its
  own engine at the same step.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from torch import Tensor, nn
from torch.utils._pytree import tree_map

_FORWARD = "_grpo_logprob_forward"


def _is_unit(module: nn.Module) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch without distributed support
        return False
    return isinstance(module, FSDPModule)


def fsdp_units(model: nn.Module) -> list[nn.Module]:
    """The FSDP2-sharded modules of ``model`` (empty when it is not sharded)."""
    return [m for m in model.modules() if _is_unit(m)]


def shard_policy(model: nn.Module, mesh: Any) -> nn.Module:
    """``fully_shard`` each decoder layer of an HF causal LM, then the model itself, over ``mesh``
    (the data-parallel dimension). Returns the (same, now sharded) model."""
    from torch.distributed.fsdp import fully_shard

    # a transformers / peft / bitsandbytes object (third-party)
    layers = getattr(model.get_decoder(), "layers", None) if hasattr(model, "get_decoder") else None
    if layers is None:
        raise TypeError(
            f"FSDP2 sharding needs an HF causal LM whose decoder has `layers` (Llama, Qwen2, ...); got {type(model).__name__}"
        )
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def run_as_forward(model: nn.Module, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` as a forward of ``model``'s root FSDP2 unit (root parameters gathered,
    gradients reduce-scattered); a plain call for a model that is not an ``FSDPModule``."""
    if not _is_unit(model):
        return fn(*args, **kwargs)
    from torch.distributed.fsdp import register_fsdp_forward_method

    if _FORWARD not in model.__dict__:
        setattr(model, _FORWARD, types.MethodType(_call_detached_views, model))
        register_fsdp_forward_method(model, _FORWARD)
    return getattr(model, _FORWARD)(fn, *args, **kwargs)


def _call_detached_views(self: nn.Module, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn``'s output with tensor views cloned: FSDP2 hooks its backward on the outputs of a forward
    and warns about views (an in-place op on one would drop the hook)."""
    return tree_map(lambda x: x.clone() if isinstance(x, Tensor) and x._is_view() else x, fn(*args, **kwargs))


@contextmanager
def gathered(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` with the full parameters of every FSDP2 unit in place (a no-op when unsharded)."""
    units = fsdp_units(model)
    for unit in units:
        unit.unshard()
    try:
        yield model
    finally:
        for unit in units:
            unit.reshard()
