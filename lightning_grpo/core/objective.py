"""One entry point that composes the chosen variants into a loss and a dict of metrics.

Per token, for the completion tokens that survive the masks:

    L_t = w_t * policy_loss_t(logp, old, A)          # w_t: off_policy.correction weight (TIS / MIS), else 1
          + kl.beta * KL_t(logp, ref)                  # KL as a loss term (beta = 0: no reference)
          - terms.entropy_coef * H_t                   # entropy bonus
          + terms.llds_coef * LLDS_t                   # likelihood-preserving regulariser (per turn)
    loss = aggregate(L, loss_mask)                     # token-mean, seq-mean-token-mean, ...

    loss_mask = mask * off_policy.rejection mask (verl rollout_rs, Geo-RS, outlier veto)
                     * off-policy sequence mask (off_policy.sequence_mask_delta)
                     * top-entropy mask (terms.top_entropy_quantile)

MIS (IcePop) gives a token outside its band weight 0 and leaves it in loss_mask, as verl and TRL
(so it counts in the normalisers); rejection removes tokens from loss_mask. With
``off_policy.is_batch_normalize`` the weights are divided by their mean over the valid tokens (zeros
included) of the whole optimizer-step batch when the trainer passes ``is_weight_mean`` (the
ratio of `GRPOLoss.is_weight_sums` summed over micro-batches and ranks), else of the batch
given. A loss whose spec has a ``sequence_is_weight`` (geo_mean) turns the token weights into one weight per
row (verl: their geometric mean).

Bypass mode (``off_policy.bypass=True``, verl ``bypass_mode``, AReaL's decoupled loss): old := roll, the
engine's log-probs, so no trainer pass computes old log-probs; the policy loss's ratio is then
pi / pi_roll (PPO-clip form: no extra IS weight) or, with ``policy_loss="reinforce"``, the
truncated IS weight of the REINFORCE form. Rejection then compares sg[logp] with roll, as verl.

Advantages may first have their negative part scaled (``terms.negative_advantage_scale``).
The settings groups (`KLSettings`, `OffPolicySettings`, `LossTerms`) live in
``lightning_grpo.core.settings``.
Every variant is looked up by name in a registry when the objective is built, so an unknown
name fails before any work; nothing here branches on a name.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple

import torch
from torch import Tensor

from .corrections import is_weight_sums, mismatch_metrics, normalize_is_weight
from .guards import check_finite
from .logprobs import masked_mean
from .objective_checks import check_loss_args, check_type, in_field, resolve_aggregation
from .registry import AGGREGATIONS, CORRECTIONS, KL_ESTIMATORS, POLICY_LOSSES, TOKEN_MASKS, TOKEN_TERMS
from .rejection import check_rejection, rejection_mask
from .settings import KLSettings, LossTerms, OffPolicySettings
from .terms import scale_negative_advantages


class LossOutput(NamedTuple):
    loss: Tensor  # [] scalar, differentiable
    metrics: dict[str, Tensor]  # detached scalars


class GRPOLoss:
    """The GRPO-family objective, composed from named variants.

    Args:
        policy_loss: name in ``POLICY_LOSSES`` ("ppo", "dual_clip", "gspo", "cispo", ...).
        policy_loss_args: keyword arguments of that loss (e.g. ``{"eps_high": 0.28}``).
        aggregation: name in ``AGGREGATIONS`` ("token_mean", "seq_mean_token_mean", ...); None:
            the policy loss's own default (``sapo``, ``geo_mean``: seq_mean_token_mean), else
            token_mean. A loss that requires one (``geo_mean``) refuses any other.
        aggregation_args: keyword arguments of the aggregation (``{"max_length": 512}`` for
            "seq_mean_token_sum_norm").
        kl: the KL-to-reference term (`KLSettings`: ``beta``, ``estimator``).
        off_policy: the train / inference gap (`OffPolicySettings`: ``correction``,
            ``correction_args``, ``is_batch_normalize``, ``rejection``, ``bypass``,
            ``sequence_mask_delta``); see the module docstring.
        terms: the extra per-token terms (`LossTerms`: ``entropy_coef``, ``llds_coef``,
            ``negative_advantage_scale``, ``top_entropy_quantile``).

    Example:
        ```python
        from lightning_grpo import GRPOLoss, KLSettings

        loss = GRPOLoss(policy_loss="gspo", aggregation="seq_mean_token_mean", kl=KLSettings(beta=0.04, estimator="k3"))
        ```
    """

    def __init__(
        self,
        policy_loss: str = "ppo",
        policy_loss_args: dict[str, Any] | None = None,
        aggregation: str | None = None,
        aggregation_args: dict[str, Any] | None = None,
        kl: KLSettings = KLSettings(),
        off_policy: OffPolicySettings = OffPolicySettings(),
        terms: LossTerms = LossTerms(),
    ) -> None:
        self._policy_loss = POLICY_LOSSES.variant(policy_loss)
        self.policy_loss_fn = self._policy_loss.fn
        self.policy_loss_args = dict(policy_loss_args or {})
        check_loss_args(policy_loss, self.policy_loss_fn, self.policy_loss_args)
        self.aggregation = resolve_aggregation(self._policy_loss, aggregation)
        self.aggregate_fn = AGGREGATIONS.get(self.aggregation)
        self.aggregation_args = dict(aggregation_args or {})
        check_type("kl", kl, KLSettings)
        check_type("off_policy", off_policy, OffPolicySettings)
        check_type("terms", terms, LossTerms)
        self._kl, self._kl_fn = kl, in_field("kl.estimator", KL_ESTIMATORS.get, kl.estimator)
        self._off_policy = off_policy
        correction, rejection = off_policy.correction, off_policy.rejection
        self._correction = (
            in_field("off_policy.correction", CORRECTIONS.variant, correction) if correction is not None else None
        )
        self._rejection = (
            in_field("off_policy.rejection", check_rejection, rejection) if rejection is not None else None
        )
        self._terms = terms
        self._off_policy_mask = TOKEN_MASKS.get("off_policy_sequence")
        self._top_entropy_mask = TOKEN_MASKS.get("top_entropy")
        self._entropy_bonus = TOKEN_TERMS.get("entropy_bonus")
        self._llds = TOKEN_TERMS.get("llds")

    # ------------------------------------------------------------------ settings (read-only)
    @property
    def kl(self) -> KLSettings:
        """The KL term's settings."""
        return self._kl

    @property
    def off_policy(self) -> OffPolicySettings:
        """The off-policy settings now in use (`set_correction` replaces the correction)."""
        return self._off_policy

    @property
    def terms(self) -> LossTerms:
        """The extra terms' settings now in use (`set_knob` moves ``entropy_coef``)."""
        return self._terms

    @property
    def beta(self) -> float:
        """The KL coefficient (0: no KL term, no reference model)."""
        return float(self._kl.beta)

    @property
    def correction(self) -> str | None:
        """The name of the train-inference correction in use, or None."""
        return self._off_policy.correction

    @property
    def bypass(self) -> bool:
        """Whether old log-probs are the engine's (bypass mode): no trainer pass computes them."""
        return self._off_policy.bypass

    def parts(self) -> dict[str, Callable[..., Any]]:
        """The functions composed, keyed by the ``model.loss.init_args`` field that configures each
        (a failing call is reported under that field)."""
        parts = {
            "policy_loss_args": self.policy_loss_fn,
            "aggregation_args": self.aggregate_fn,
            "kl.estimator": self._kl_fn,
        }
        if self._correction is not None:
            parts["off_policy.correction_args"] = self._correction.fn
        return parts

    # ------------------------------------------------------------------ knobs (controllers)
    def knobs(self) -> tuple[str, ...]:
        """Names a controller may move during training: ``entropy_coef`` and the numeric keyword
        arguments of the configured policy loss (``eps_high``, ``clip_ratio``, ``kl_cov_ratio``, ...)."""
        params = inspect.signature(self.policy_loss_fn).parameters.values()
        numeric = [p.name for p in params if p.kind is p.KEYWORD_ONLY and isinstance(p.default, float)]
        return ("entropy_coef", *numeric)

    def knob(self, name: str) -> float:
        """Current value of a knob (a policy-loss argument not given explicitly: its default)."""
        if name == "entropy_coef":
            return float(self._terms.entropy_coef)
        self._check_knob(name)
        default = inspect.signature(self.policy_loss_fn).parameters[name].default
        return float(self.policy_loss_args.get(name, default))

    def set_knob(self, name: str, value: float) -> None:
        """Set a knob for the following loss calls (EntropyController); ``value`` finite and >= 0."""
        self._check_knob(name)
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"GRPOLoss knob {name} must be finite and >= 0, got {value}")
        if name == "entropy_coef":
            self._terms = replace(self._terms, entropy_coef=float(value))
        else:
            self.policy_loss_args[name] = float(value)

    def set_correction(self, name: str | None, args: dict[str, Any] | None = None) -> None:
        """Switch the train-inference correction (a name in ``CORRECTIONS``, or None = off) for the
        following loss calls (MismatchGuard ``fix``)."""
        if name is not None and self.bypass:
            raise ValueError(
                f"GRPOLoss off_policy.bypass=True: the ratio already is pi / pi_roll, no correction can be added (got {name!r})"
            )
        self._correction = CORRECTIONS.variant(name) if name is not None else None
        self._off_policy = replace(self._off_policy, correction=name, correction_args=dict(args) if args else None)

    def _check_knob(self, name: str) -> None:
        if name not in self.knobs():
            raise ValueError(
                f"GRPOLoss has no knob {name!r} with this policy loss; available: {', '.join(self.knobs())}"
            )

    @property
    def needs_entropy(self) -> bool:
        """Whether a call needs ``entropy`` (entropy bonus or top-entropy mask)."""
        return self._terms.entropy_coef != 0.0 or self._terms.top_entropy_quantile is not None

    @property
    def needs_reference(self) -> bool:
        """Whether a call needs ``ref_logp`` (a KL term: ``kl.beta`` > 0)."""
        return self.beta != 0.0

    @property
    def needs_rollout_logprobs(self) -> bool:
        """Whether a call needs ``rollout_logp`` (a correction, rejection, bypass or the sequence mask)."""
        off = self._off_policy
        return (
            self._correction is not None
            or off.sequence_mask_delta is not None
            or self._rejection is not None
            or self.bypass
        )

    @property
    def masks_before_training(self) -> bool:
        """Whether tokens are dropped by rules that look only at old and roll (rollout rejection; not
        in bypass mode): a trainer can then compute `static_keep_mask` once per generation batch
        and leave the dropped tokens out of its global normaliser."""
        return not self.bypass and self._rejection is not None

    @property
    def normalizes_is_weights(self) -> bool:
        """Whether the correction's weights are batch-normalised: a trainer then sums
        `is_weight_sums` over the optimizer-step batch and passes ``is_weight_mean``."""
        return self._off_policy.is_batch_normalize and self._correction is not None and not self.bypass

    @property
    def needs_old_before_training(self) -> bool:
        """Whether a trainer should compute old log-probs once per generation batch even when the batch
        is used for one update only (the masks or the IS-weight mean of a whole batch depend on them)."""
        return self.masks_before_training or self.normalizes_is_weights

    def static_keep_mask(self, old_logp: Tensor, rollout_logp: Tensor, mask: Tensor) -> Tensor:
        """[B, T] float 0/1: the tokens the rejection criteria keep (they depend on old and roll only,
        so one pass over a whole generation batch gives every micro-batch's mask)."""
        keep = mask.to(torch.float32)
        if self._rejection is not None:
            keep = keep * rejection_mask(old_logp, rollout_logp, mask, self._rejection).keep
        return keep

    def is_weight_sums(self, old_logp: Tensor, rollout_logp: Tensor, mask: Tensor) -> Tensor:
        """[2] (sum, count) of the batch-normalisation mean of the correction's weights over the rows
        given (zeros when not normalising); sum them over micro-batches and ranks, pass the ratio as
        ``is_weight_mean``. old_logp, rollout_logp, mask [B, T]."""
        if not self.normalizes_is_weights:
            return torch.zeros(2, device=mask.device)
        corr = self._correction.fn(old_logp, rollout_logp, mask, **(self._off_policy.correction_args or {}))
        return is_weight_sums(corr.weight, mask, self._correction.spec.level)

    def __call__(
        self,
        logp: Tensor,  # [B, T] log pi_theta of the sampled tokens (with grad)
        mask: Tensor,  # [B, T] 1 on completion tokens
        advantages: Tensor,  # [B] or [B, T]
        *,
        old_logp: Tensor | None = None,  # [B, T]; None = on-policy (sg[logp])
        ref_logp: Tensor | None = None,  # [B, T]; needed when beta > 0
        rollout_logp: Tensor | None = None,  # [B, T] from the rollout engine
        entropy: Tensor | None = None,  # [B, T]; needed for entropy bonus / top-entropy mask
        num_tokens: float | Tensor | None = None,  # global normaliser (token-mean)
        num_sequences: float | Tensor | None = None,  # global normaliser (seq-mean modes)
        is_weight_mean: float | Tensor | None = None,  # global IS-weight mean (off_policy.is_batch_normalize)
        generator: torch.Generator | None = None,
        turn_ids: Tensor | None = None,  # [B, T] long: model turn per token (multi-turn; LLDS gates per turn)
    ) -> LossOutput:
        mask = mask.to(torch.float32)
        old = logp.detach() if old_logp is None else old_logp
        self._check_inputs(logp, mask, old, ref_logp, rollout_logp, entropy)
        trainer_side = old  # the trainer's log-probs of the sampling policy, compared with roll
        if self.bypass:  # old := roll; the current policy (no gradient) is the trainer side
            old, trainer_side = rollout_logp, logp.detach()
        terms = self._terms
        if terms.negative_advantage_scale != 1.0:
            advantages = scale_negative_advantages(advantages, terms.negative_advantage_scale)

        metrics: dict[str, Tensor] = {}
        loss_mask = self._loss_mask(logp, mask, trainer_side, advantages, rollout_logp, entropy, metrics)
        weight = self._weight(mask, loss_mask, trainer_side, rollout_logp, is_weight_mean, metrics)  # [B, T]

        pl = self.policy_loss_fn(logp, old, advantages, loss_mask, generator=generator, **self.policy_loss_args)
        token_loss = pl.loss * weight  # [B, T]
        metrics.update(pl.metrics)
        if self.beta != 0.0:
            kl = self._kl_fn(logp, ref_logp, old_logp=old)  # [B, T]
            token_loss = token_loss + self.beta * kl
            metrics["kl"] = masked_mean(kl.detach(), loss_mask)
        if terms.entropy_coef != 0.0:
            token_loss = token_loss + self._entropy_bonus(entropy, loss_mask, terms.entropy_coef)
        if terms.llds_coef != 0.0:
            token_loss = token_loss + self._llds(logp, old, loss_mask, terms.llds_coef, turn_ids=turn_ids)

        loss = self.aggregate_fn(
            token_loss, loss_mask, num_tokens=num_tokens, num_sequences=num_sequences, **self.aggregation_args
        )
        if entropy is not None:
            metrics["entropy"] = masked_mean(entropy.detach().float(), mask)
        n_valid = mask.sum()
        metrics["masked_frac"] = torch.where(n_valid > 0, 1.0 - loss_mask.sum() / n_valid.clamp(min=1), 0.0)
        metrics["loss"] = loss.detach()
        return LossOutput(loss, metrics)

    def _loss_mask(self, logp, mask, old, advantages, rollout_logp, entropy, metrics) -> Tensor:
        loss_mask = mask
        if rollout_logp is not None and not self.bypass:  # bypass: no trainer-side old log-probs to compare
            metrics.update(mismatch_metrics(old, rollout_logp, mask))
        if self._rejection is not None:
            rejected = rejection_mask(old, rollout_logp, mask, self._rejection)
            loss_mask = loss_mask * rejected.keep
            metrics.update(rejected.metrics)
        delta = self._off_policy.sequence_mask_delta
        if delta is not None:
            seq_keep = self._off_policy_mask(logp, rollout_logp, advantages, mask, delta)  # [B]
            loss_mask = loss_mask * seq_keep.unsqueeze(-1)
            metrics["off_policy_masked_frac"] = 1.0 - seq_keep.float().mean()
        quantile = self._terms.top_entropy_quantile
        if quantile is not None:
            loss_mask = loss_mask * self._top_entropy_mask(entropy, loss_mask, quantile)
        return loss_mask

    def _weight(self, mask, loss_mask, old, rollout_logp, is_weight_mean, metrics) -> Tensor:
        """The correction's weight [B, T] (1 without one), batch-normalised, and made one per row for a
        loss whose spec has a ``sequence_is_weight`` (geo_mean: verl's geometric mean over the row's tokens)."""
        if self._correction is None:
            return torch.ones_like(mask)
        corr = self._correction.fn(old, rollout_logp, mask, **(self._off_policy.correction_args or {}))
        weight = corr.weight
        metrics.update(corr.metrics)
        if self._off_policy.is_batch_normalize:
            weight, metrics["is_batch_norm_factor"] = normalize_is_weight(
                weight, mask, self._correction.spec.level, is_weight_mean
            )
        per_row = self._policy_loss.spec.sequence_is_weight
        return weight if per_row is None else per_row(weight, loss_mask)

    def _check_inputs(self, logp, mask, old, ref_logp, rollout_logp, entropy) -> None:
        if logp.shape != mask.shape:
            raise ValueError(f"logp has shape {tuple(logp.shape)} but mask has shape {tuple(mask.shape)}")
        if self.needs_reference and ref_logp is None:
            raise ValueError("kl.beta > 0 needs ref_logp (the reference model's log-probs)")
        if self.needs_rollout_logprobs and rollout_logp is None:
            raise ValueError(
                "off_policy correction / rejection / bypass / sequence_mask_delta need rollout_logp (the engine's log-probs)"
            )
        if self.needs_entropy and entropy is None:
            raise ValueError("terms.entropy_coef / terms.top_entropy_quantile need entropy")
        for name, t in (("logp", logp), ("old_logp", old), ("ref_logp", ref_logp), ("rollout_logp", rollout_logp)):
            if t is not None:
                check_finite(name, t.detach(), mask)
