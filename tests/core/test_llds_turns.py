"""LLDS gated per action (model turn) on a hand-built two-turn episode."""

from __future__ import annotations

import torch

from lightning_grpo.core import GRPOLoss, LossTerms
from lightning_grpo.core.terms import llds


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


def two_turn_case():
    # One episode: turn 0 (3 tokens), 2 environment tokens, turn 1 (2 tokens), 1 pad.
    #            t0    t0    t0   env   env   t1    t1   pad
    d = torch.tensor([[-0.4, 0.1, 0.1, -7.0, -7.0, 0.5, -0.2, -9.0]])
    turn_ids = torch.tensor([[0, 0, 0, -1, -1, 1, 1, -1]])
    mask = (turn_ids >= 0).float()
    old = torch.full_like(d, -1.0)
    return (old + d).requires_grad_(True), old, mask, turn_ids


def test_llds_per_turn_hand_worked():
    logp, old, mask, turn_ids = two_turn_case()
    # turn 0: sum d = -0.2 < 0 -> gated on; only its token 0 fell (0.4)
    # turn 1: sum d = +0.3 >= 0 -> untouched, although its token 1 fell (0.2)
    # environment and pad tokens: masked (their -7 / -9 never enter a sum)
    out = llds(logp, old, mask, 0.5, turn_ids=turn_ids)
    close(out, [[0.5 * 0.4, 0, 0, 0, 0, 0, 0, 0]])
    out.sum().backward()
    close(logp.grad, [[-0.5, 0, 0, 0, 0, 0, 0, 0]])


def test_llds_per_row_differs_on_the_same_case():
    # Gated per row (one response), the whole episode sums to +0.1 -> no regularisation at all:
    # the per-action gate is what catches the turn whose likelihood fell.
    logp, old, mask, _ = two_turn_case()
    close(llds(logp, old, mask, 0.5), torch.zeros(1, 8))


def test_llds_per_turn_second_turn_fell():
    logp, old, mask, turn_ids = two_turn_case()
    d = torch.tensor([[0.3, 0.1, 0.1, 0.0, 0.0, 0.1, -0.6, 0.0]])
    logp = (old + d).requires_grad_(True)
    out = llds(logp, old, mask, 2.0, turn_ids=turn_ids)  # turn 0 rose, turn 1 fell (-0.5)
    close(out, [[0, 0, 0, 0, 0, 0, 2.0 * 0.6, 0]])


def test_grpo_loss_passes_turn_ids_to_llds():
    logp, old, mask, turn_ids = two_turn_case()
    adv = torch.zeros(1)  # policy term 0: only LLDS remains
    loss_fn = GRPOLoss(terms=LossTerms(llds_coef=0.5))
    out = loss_fn(logp, mask, adv, old_logp=old, turn_ids=turn_ids, num_tokens=mask.sum())
    close(out.loss, 0.5 * 0.4 / 5)  # token-mean over the 5 sampled tokens
    out_rows = loss_fn(logp, mask, adv, old_logp=old, num_tokens=mask.sum())
    close(out_rows.loss, 0.0)
