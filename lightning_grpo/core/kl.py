"""KL divergence to the reference policy: per-token estimators, KL-in-reward, and controllers.

Tokens o_t are sampled from pi_theta (or from pi_old, see ``k3_unbiased``). With
d_t = log pi_ref(o_t) - log pi_theta(o_t), each estimator's expectation under pi_theta is
KL(pi_theta || pi_ref) (J. Schulman, "Approximating KL divergence", 2020):

    k1 = -d                  unbiased, high variance, can be negative
    k2 = d^2 / 2             biased, low variance; its gradient is the KL's (verl "k2"/"mse")
    k3 = exp(d) - d - 1      unbiased, low variance, >= 0 (TRL's GRPO KL, verl "low_var_kl")
    k1+, k3+, low_var_kl+    straight-through: the value of k1 / k3 / low_var_kl, the gradient of
                             k2 (verl's "+" KL types): k2 - sg[k2] + sg[value]

Numerics: d is clamped to +-20 (``clamp_log_ratio``) in k2, k3, low_var_kl and k3_unbiased,
so +-100 gives finite values (verl clamps d in low_var_kl only; TRL applies no clamp);
verl's "low_var_kl" additionally clamps k3 to [-10, 10]. The clamp also blocks a nan on a
masked position from reaching the gradient (the aggregation ignores masked values).

Registry ``KL_ESTIMATORS``: ``fn(logp [B,T], ref_logp [B,T], *, old_logp=None) -> [B,T]``
float32 (upcast from bf16/fp16). Differentiable in ``logp``; ``ref_logp`` and ``old_logp``
are treated as constants. Masking is the caller's job (aggregation ignores masked entries).

Registry ``KL_CONTROLLERS``: "fixed" and "adaptive" (Ziegler et al. 2019, verl ``kl_ctrl``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .guards import clamp_log_ratio
from .logprobs import masked_sum
from .registry import KL_CONTROLLERS, KL_ESTIMATORS


def _f32(x: Tensor) -> Tensor:
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    d = clamp_log_ratio(_f32(ref_logp).detach() - _f32(logp))  # [B, T]
    return torch.exp(d) - d - 1.0


@KL_ESTIMATORS.register("k1")
def kl_k1(logp: Tensor, ref_logp: Tensor, *, old_logp: Tensor | None = None) -> Tensor:
    """k1 = logp - ref_logp, [B, T]. ``old_logp`` unused. (verl "k1"/"kl")."""
    return _f32(logp) - _f32(ref_logp).detach()


@KL_ESTIMATORS.register("k2")
def kl_k2(logp: Tensor, ref_logp: Tensor, *, old_logp: Tensor | None = None) -> Tensor:
    """k2 = d^2 / 2 with d = clamp(ref_logp - logp, -20, 20), [B, T]. ``old_logp`` unused.

    verl "k2"/"mse" has no clamp; ours caps k2 at 200 and stops the gradient beyond |d| = 20,
    like k3. The clamp also keeps a nan on a padding position (where engines often put one)
    out of the gradient: torch.clamp's backward passes 0 for a nan input.
    """
    return 0.5 * clamp_log_ratio(_f32(ref_logp).detach() - _f32(logp)).square()


@KL_ESTIMATORS.register("k3")
def kl_k3(logp: Tensor, ref_logp: Tensor, *, old_logp: Tensor | None = None) -> Tensor:
    """k3 = exp(d) - d - 1 with d = clamp(ref_logp - logp, -20, 20), [B, T], >= 0.

    ``old_logp`` unused. TRL's GRPO KL term (which has no clamp); the clamp keeps it finite.
    """
    return _k3(logp, ref_logp)


@KL_ESTIMATORS.register("low_var_kl")
def kl_low_var(logp: Tensor, ref_logp: Tensor, *, old_logp: Tensor | None = None) -> Tensor:
    """verl "low_var_kl": clamp(exp(d) - d - 1, -10, 10), d = clamp(ref_logp - logp, -20, 20). [B, T].

    ``old_logp`` unused. The upper clamp at 10 zeroes the gradient of tokens far from ref.
    """
    return _k3(logp, ref_logp).clamp(min=-10.0, max=10.0)


@KL_ESTIMATORS.register("k3_unbiased")
def kl_k3_unbiased(logp: Tensor, ref_logp: Tensor, *, old_logp: Tensor | None = None) -> Tensor:
    """DeepSeek-V3.2 unbiased KL under off-policy data: rho * k3, [B, T].

    rho = exp(clamp(logp - old_logp, -20, 20)) = pi_theta / pi_old, k3 as in "k3".
    The tokens were sampled from pi_old, so E_old[rho * k3] = E_theta[k3] = KL(pi_theta || pi_ref).
    rho is NOT detached (as in TRL ``use_bias_correction_kl``, which multiplies k3 by the
    undetached ratio): then the gradient, too, is an unbiased estimate of grad KL. With
    old_logp = sg[logp] the value equals k3 and the gradient gains the score term
    k3 * grad(logp). ``old_logp`` is required.
    """
    if old_logp is None:
        raise ValueError("kl estimator 'k3_unbiased' needs old_logp (the log-probs of the sampling policy)")
    rho = torch.exp(clamp_log_ratio(_f32(logp) - _f32(old_logp).detach()))  # [B, T]
    return rho * _k3(logp, ref_logp)


def _straight_through(name: str, value_fn):
    """Register ``name``: the value of ``value_fn``, the gradient of k2 (verl's KL types ending in "+")."""

    @KL_ESTIMATORS.register(name)
    def estimator(logp: Tensor, ref_logp: Tensor, *, old_logp: Tensor | None = None) -> Tensor:
        k2 = kl_k2(logp, ref_logp)  # [B, T]
        return k2 - k2.detach() + value_fn(logp, ref_logp, old_logp=old_logp).detach()

    estimator.__name__ = estimator.__qualname__ = f"kl_{name.replace('+', '_plus')}"
    estimator.__doc__ = (
        f"Straight-through {name}: value of {name[:-1]!r}, gradient of k2 = d^2 / 2, [B, T].\n\n"
        "k1 and k3 estimate the KL without bias but their gradients are not the KL's gradient; "
        "k2's is (Schulman 2020). verl computes ``k2 - sg[k2] + sg[value]`` for kl_loss_type "
        f"{name!r}; k2 here is clamped like ``kl_k2`` (verl's is not)."
    )
    return estimator


kl_k1_plus = _straight_through("k1+", kl_k1)
kl_k3_plus = _straight_through("k3+", kl_k3)
kl_low_var_plus = _straight_through("low_var_kl+", kl_low_var)


def kl_penalty_in_reward(
    rewards: Tensor,
    logp: Tensor,
    ref_logp: Tensor,
    mask: Tensor,
    beta: float,
    estimator: str = "k1",
    *,
    old_logp: Tensor | None = None,
) -> Tensor:
    """r_i - beta * sum_t m_it * kl_it: the KL moved into the reward (verl ``use_kl_in_reward``).

    rewards [B], logp / ref_logp / mask [B, T] -> [B] float32, detached (rewards carry no
    gradient; the KL reaches the policy through the advantage). ``estimator`` names a
    ``KL_ESTIMATORS`` entry (default "k1", verl's ``kl_penalty`` default and OpenRLHF's);
    ``logp`` is the sampling policy's log-prob (verl uses old_log_prob). Masked entries of the
    KL are ignored even when nan.
    """
    kl = KL_ESTIMATORS.get(estimator)(logp.detach(), ref_logp.detach(), old_logp=old_logp)  # [B, T]
    return (_f32(rewards).detach() - beta * masked_sum(kl.detach(), mask, dim=-1)).float()


@KL_CONTROLLERS.register("fixed")
class FixedKLController:
    """A constant KL coefficient: ``value`` = ``kl_coef`` forever.

    Args:
        kl_coef: the coefficient (default 0.001, verl ``algorithm.kl_ctrl.kl_coef``).
    """

    def __init__(self, kl_coef: float = 0.001) -> None:
        if kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
        self.value = float(kl_coef)

    def update(self, current_kl: float | Tensor, n_steps: int) -> None:
        """No-op (kept so that every controller has the same interface)."""

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])


@KL_CONTROLLERS.register("adaptive")
class AdaptiveKLController:
    """Proportional controller that steers the KL toward ``target_kl`` (Ziegler et al. 2019, verl).

    update(kl, n): e = clip(kl / target_kl - 1, -0.2, 0.2); value *= 1 + e * n / horizon.

    Args:
        kl_coef: initial coefficient (default 0.001, verl ``kl_ctrl.kl_coef``).
        target_kl: the KL to steer toward (default 0.1, verl ``kl_ctrl.target_kl``).
        horizon: how many samples (``n_steps`` units) a full 20% correction takes
            (default 10000, verl ``kl_ctrl.horizon``).

    ``n_steps`` is the number of samples the KL was measured on (verl passes the batch size).
    A non-finite ``current_kl`` leaves ``value`` unchanged (a departure from verl, where one
    nan KL would make the coefficient nan for the rest of the run).
    """

    def __init__(self, kl_coef: float = 0.001, target_kl: float = 0.1, horizon: int = 10000) -> None:
        if kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
        if target_kl <= 0:
            raise ValueError(f"target_kl must be > 0, got {target_kl}")
        if horizon <= 0:
            raise ValueError(f"horizon must be > 0, got {horizon}")
        self.value = float(kl_coef)
        self.target_kl = float(target_kl)
        self.horizon = int(horizon)

    def update(self, current_kl: float | Tensor, n_steps: int) -> None:
        kl = float(current_kl)
        if kl != kl or kl in (float("inf"), float("-inf")):
            return
        error = min(max(kl / self.target_kl - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])
