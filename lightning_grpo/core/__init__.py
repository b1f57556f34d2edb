"""The algorithm core: pure tensor math of the GRPO family (imports torch only).

Every variant is a small function registered by name; :class:`GRPOLoss` composes the chosen
ones into a loss and a dict of metrics. See ``docs/algorithms.md`` for the table
equation -> function -> name / parameters.
"""

from .registry import (
    ADVANTAGES,
    AGGREGATIONS,
    CORRECTIONS,
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    LOGPROBS,
    POLICY_LOSSES,
    REGISTRIES,
    REJECTIONS,
    REWARD_AGGREGATIONS,
    SELECTIONS,
    TOKEN_MASKS,
    TOKEN_TERMS,
    Registry,
)

# Importing the modules fills the registries.
from .guards import NonFiniteError, check_finite, clamp_log_ratio
from .logprobs import TokenLogProbs, logprobs_from_hidden, logprobs_from_logits, masked_mean, masked_sum, masked_var
from .advantages import (
    batch_std_advantages,
    dr_grpo_advantages,
    expand_to_tokens,
    gpg_advantages,
    grpo_advantages,
    normalize_then_sum,
    opo_advantages,
    qae_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
    sum_then_normalize,
)
from .passk_advantages import max_rl_advantages, passk_advantages
from .aggregation import seq_mean_token_mean, seq_mean_token_sum, seq_mean_token_sum_norm, token_mean
from .corrections import (
    CorrectionOutput,
    mis_seq,
    mis_token,
    mismatch_metrics,
    normalize_is_weight,
    off_policy_sequence_mask,
    tis_seq,
    tis_seq_geo,
    tis_token,
)
from .kl import (
    AdaptiveKLController,
    FixedKLController,
    kl_k1,
    kl_k1_plus,
    kl_k2,
    kl_k3,
    kl_k3_plus,
    kl_k3_unbiased,
    kl_low_var,
    kl_low_var_plus,
    kl_penalty_in_reward,
)
from .policy_losses import (
    PolicyLossOutput,
    cispo_loss,
    clip_cov_loss,
    clipped_surrogate,
    delta_clip_loss,
    dual_clip_loss,
    geo_mean_loss,
    gspo_loss,
    gspo_token_loss,
    kl_cov_loss,
    ppo_loss,
)
from .trust_region_losses import dppo_kl_loss, dppo_tv_loss, sapo_loss
from .pg_losses import dro_loss, gpg_loss, reinforce_loss
from .rejection import RejectionOutput, check_rejection, rejection_mask
from .shaping import (
    dynamic_sampling_filter,
    gfpo_advantages,
    gfpo_length_selection,
    gfpo_reward_per_token_selection,
    soft_overlong_punishment,
)
from .terms import entropy_bonus, llds, scale_negative_advantages, top_entropy_mask
from .settings import KLSettings, LossTerms, OffPolicySettings
from .objective import GRPOLoss, LossOutput

__all__ = [name for name in dir() if not name.startswith("_")]
