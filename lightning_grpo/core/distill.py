"""On-policy distillation math: the reverse-KL token advantage and GKD's generalised JSD.

On-policy distillation (OPD; Thinking Machines 2025, verl ``distillation`` with
``use_policy_gradient``, slime ``--use-opd``): the student samples, a teacher with the same
tokenizer scores the sampled tokens, and the per-token reverse-KL estimate

    k_t = log pi_student(o_t) - log pi_teacher(o_t)          (o_t ~ pi_student: k1 of KL(student || teacher))

becomes a token-level advantage, trained with the usual policy loss:

    pure   A_t = -coef * k_t                                   (no reward needed)
    mixed  A_t = A_i - coef * k_t                              (slime ``apply_opd_kl_to_advantages``)

GKD (Agarwal et al. 2024, arXiv 2306.13649; TRL ``GKDTrainer.generalized_jsd_loss``): with
s = log_softmax(z_student / T), t = log_softmax(z_teacher / T) over the vocabulary at each position,

    beta = 0       KL(teacher || student) = sum_v e^t (t - s)
    beta = 1       KL(student || teacher) = sum_v e^s (s - t)
    0 < beta < 1   beta KL(teacher || M) + (1 - beta) KL(student || M),  M = beta e^t + (1 - beta) e^s

as TRL defines it (its endpoints are the two KLs, not the limits of the mixture formula).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["opd_advantages", "group_token_baseline", "generalized_jsd"]


def opd_advantages(
    student_logp: Tensor, teacher_logp: Tensor, mask: Tensor, coef: float = 1.0, reward_advantages: Tensor | None = None
) -> Tensor:
    """Token advantages of on-policy distillation. [B, T] in -> [B, T] float32, 0 off the mask, detached.

    A_t = reward_advantages_t - coef * (student_logp_t - teacher_logp_t); ``reward_advantages``
    [B] (broadcast over tokens) or [B, T], or None for pure distillation (A_t = -coef * k_t).
    """
    if student_logp.shape != teacher_logp.shape or mask.shape != student_logp.shape or student_logp.dim() != 2:
        raise ValueError(
            f"student_logp, teacher_logp and mask must share one [B, T] shape; got {tuple(student_logp.shape)}, "
            f"{tuple(teacher_logp.shape)}, {tuple(mask.shape)}"
        )
    valid = mask != 0
    k = student_logp.detach().float() - teacher_logp.detach().float()  # [B, T] reverse-KL estimate
    adv = -coef * k
    if reward_advantages is not None:
        base = reward_advantages.detach().float()
        adv = adv + (base.unsqueeze(-1) if base.dim() == 1 else base)
    return torch.where(valid, adv, torch.zeros((), dtype=adv.dtype, device=adv.device))


def group_token_baseline(advantages: Tensor, mask: Tensor, group_size: int) -> Tensor:
    """Subtract from each token advantage the mean of the other completions of its group at the same
    position (leave-one-out, RLOO at every position): A'_it = A_it - mean_{j != i, j valid at t} A_jt.

    advantages, mask [B, T] (rows group-contiguous, B = P * group_size) -> [B, T], 0 off the mask.
    At t = 0 every completion of a group is in the same state (the prompt), so this is a baseline
    that leaves the gradient unbiased and cuts its variance; later positions share the position only.
    A token with no other valid one at its position keeps its advantage.
    """
    if advantages.shape != mask.shape or advantages.dim() != 2 or advantages.shape[0] % group_size:
        raise ValueError(f"advantages and mask must be one [B, T] shape with B divisible by group_size={group_size}")
    m = (mask != 0).float().view(-1, group_size, mask.shape[1])  # [P, G, T]
    a = advantages.float().view_as(m) * m
    others = m.sum(1, keepdim=True) - m  # [P, G, T] valid other completions at each position
    baseline = torch.where(others > 0, (a.sum(1, keepdim=True) - a) / others.clamp(min=1), torch.zeros_like(a))
    return ((a - baseline) * m).view_as(advantages)


def generalized_jsd(
    student_logits: Tensor, teacher_logits: Tensor, beta: float = 0.5, temperature: float = 1.0
) -> Tensor:
    """Generalised Jensen-Shannon divergence per position (TRL's definition, see the module docstring).

    student_logits, teacher_logits: [..., V] (the teacher's are detached) -> [...] float32 (float64
    kept), >= 0,
    differentiable in the student's logits. beta 0.5 and temperature 1.0 are TRL's defaults.
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"GKD beta must be in [0, 1], got {beta}")
    if temperature <= 0:
        raise ValueError(f"GKD temperature must be > 0, got {temperature}")
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student and teacher logits differ in shape: {tuple(student_logits.shape)} vs {tuple(teacher_logits.shape)}"
        )
    dtype = torch.promote_types(student_logits.dtype, torch.float32)  # float32, or float64 kept
    s = torch.log_softmax(student_logits.to(dtype) / temperature, dim=-1)
    t = torch.log_softmax(teacher_logits.detach().to(dtype) / temperature, dim=-1)
    if beta == 0.0:
        return (t.exp() * (t - s)).sum(-1)
    if beta == 1.0:
        return (s.exp() * (s - t)).sum(-1)
    m = torch.logsumexp(torch.stack([s + math.log(1.0 - beta), t + math.log(beta)]), dim=0)  # [..., V] log M
    kl_teacher = (t.exp() * (t - m)).sum(-1)
    kl_student = (s.exp() * (s - m)).sum(-1)
    return beta * kl_teacher + (1.0 - beta) * kl_student
