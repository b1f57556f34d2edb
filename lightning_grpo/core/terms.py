"""Per-token loss terms, token masks and the negative-advantage scale.

Token terms (registry ``TOKEN_TERMS``) return a [B, T] tensor added to the per-token policy
loss before aggregation (0 on masked tokens):

    entropy_bonus   -coef * H_t                                     (verl entropy_coeff, TRL entropy_coef)
    llds            coef * max(0, old_t - logp_t) * 1[sum_t (logp - old) < 0]   (LLDS, arXiv 2512.04220)

Token masks (registry ``TOKEN_MASKS``) return a [B, T] float 0/1 tensor multiplied into the
loss mask:

    top_entropy     1[H_t >= q-quantile of H over valid tokens]     ("Beyond the 80/20 rule")

Advantage transform (plain function, not registered):

    scale_negative_advantages   A <- A * scale where A < 0           (agentic RL practice)

Departures:
- ``top_entropy_mask`` takes the threshold quantile ``q`` (keep H >= quantile_q(H)), so q = 0.8
  keeps the top 20%. TRL's ``top_entropy_quantile`` is rho = the fraction *kept* (rho = 0.2 keeps
  the top 20%; TRL computes ``quantile(H, 1 - rho)``): q = 1 - rho. The quantile is taken over
  the valid tokens of the tensor given (one micro-batch on one rank); TRL gathers the entropies
  of all ranks first. Interpolation is linear, as ``torch.quantile`` (TRL).
- LLDS: the paper's regulariser acts on responses whose likelihood fell under the update and
  only on the tokens whose log-prob fell; we gate per row (one response = one row) with
  sum_t (logp - old) < 0 and regularise with the hinge max(0, old - logp); multi-turn episodes
  gate per action (model turn, ``turn_ids``) as the paper does. ``coef`` has no default (pick it
  per recipe).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .registry import TOKEN_MASKS, TOKEN_TERMS

__all__ = ["entropy_bonus", "llds", "top_entropy_mask", "scale_negative_advantages"]


def _valid_and_dtype(x: Tensor, mask: Tensor) -> tuple[Tensor, torch.dtype]:
    if mask.shape != x.shape or x.dim() != 2:
        raise ValueError(f"expected a [B, T] tensor and a mask of its shape, got {tuple(x.shape)}, {tuple(mask.shape)}")
    return mask != 0, torch.promote_types(x.dtype, torch.float32)


@TOKEN_TERMS.register("entropy_bonus")
def entropy_bonus(entropy: Tensor, mask: Tensor, coef: float) -> Tensor:
    """Entropy bonus as a per-token loss term: ``-coef * H_t`` on valid tokens, 0 elsewhere.

    entropy, mask: [B, T] -> [B, T] float32 (float64 stays float64). The gradient flows
    through ``entropy`` (compute it with gradient to get the bonus's effect).
    """
    valid, dtype = _valid_and_dtype(entropy, mask)
    h = entropy.to(dtype)
    return torch.where(valid, -coef * h, torch.zeros((), dtype=dtype, device=h.device))


@TOKEN_TERMS.register("llds")
def llds(logp: Tensor, old_logp: Tensor, mask: Tensor, coef: float, turn_ids: Tensor | None = None) -> Tensor:
    """LLDS likelihood-preserving regulariser (arXiv 2512.04220), gated per action.

    d_t = logp_t - old_t (old detached);  gate_a = 1[sum_{t in a} d_t < 0] over the valid tokens
    of action a;  L_t = coef * gate_a(t) * max(0, -d_t)   on valid tokens, 0 elsewhere.
    An action is one model turn of a multi-turn episode (``turn_ids`` [B, T] long: the turn of
    each token, < 0 on tokens outside any turn), else the whole row (one response). Acts only on
    actions whose log-likelihood fell, and only on their tokens whose log-prob fell; its gradient
    on such a token is -coef d logp_t (pushes the log-prob back up).
    logp, old_logp, mask: [B, T] -> [B, T] float32.
    """
    valid, dtype = _valid_and_dtype(logp, mask)
    if old_logp.shape != logp.shape:
        raise ValueError(f"old_logp has shape {tuple(old_logp.shape)}, logp {tuple(logp.shape)}")
    zero = torch.zeros((), dtype=dtype, device=logp.device)
    d = torch.where(valid, logp.to(dtype) - old_logp.detach().to(dtype), zero)  # [B, T]
    if turn_ids is None:
        fell = (d.detach().sum(dim=-1, keepdim=True) < 0) & valid  # [B, T]
    else:
        if turn_ids.shape != logp.shape:
            raise ValueError(f"turn_ids has shape {tuple(turn_ids.shape)}, logp {tuple(logp.shape)}")
        turn = turn_ids.long().clamp(min=-1) + 1  # [B, T] 0 = outside any turn
        sums = torch.zeros(logp.shape[0], int(turn.max()) + 1, dtype=dtype, device=logp.device)  # [B, turns+1]
        sums.scatter_add_(1, turn, d.detach())
        fell = (sums.gather(1, turn) < 0) & valid & (turn > 0)  # [B, T]
    return torch.where(fell, coef * torch.relu(-d), zero)


def _linear_quantile(values: Tensor, q: float) -> Tensor:
    """torch.quantile(values, q) (linear interpolation) via sort: no 2**24-element limit."""
    s = values.sort().values
    pos = q * (s.numel() - 1)
    lo = int(pos)
    hi = min(lo + 1, s.numel() - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@TOKEN_MASKS.register("top_entropy")
def top_entropy_mask(entropy: Tensor, mask: Tensor, quantile: float = 0.8) -> Tensor:
    """Keep only high-entropy tokens ("Beyond the 80/20 rule", Wang et al. 2025).

    keep_t = 1[H_t >= quantile_q({H_s : s valid})] on valid tokens, 0 elsewhere, with linear
    interpolation. q = 0.8 (default, the paper's recipe) keeps the top 20%; q = 0 keeps every
    valid token; q = 1 only the maximum. TRL's rho corresponds to q = 1 - rho. Detached.
    entropy, mask: [B, T] -> [B, T] float32 0/1. No valid token -> all zeros.
    """
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {quantile}")
    valid, dtype = _valid_and_dtype(entropy, mask)
    h = entropy.detach().to(dtype)
    values = h[valid]
    if values.numel() == 0:
        return torch.zeros(entropy.shape, dtype=torch.float32, device=entropy.device)
    keep = (h >= _linear_quantile(values, quantile)) & valid
    return keep.to(torch.float32)


def scale_negative_advantages(advantages: Tensor, scale: float) -> Tensor:
    """Scale the negative part of the advantages: A' = A * scale where A < 0, else A.

    scale = 1 leaves A unchanged, scale = 0 drops negative samples (+1/-1 -> +1/0). Any shape
    ([B] or [B, T]); same shape and dtype. scale must be >= 0 (a negative one flips the sign).
    """
    if scale < 0:
        raise ValueError(f"scale must be >= 0, got {scale}")
    return torch.where(advantages < 0, advantages * scale, advantages)
