"""opo, gpg, passk, max_rl: hand-worked values, plain-loop references, edge cases."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_grpo.core import ADVANTAGES
from lightning_grpo.core.advantages import gpg_advantages, opo_advantages
from lightning_grpo.core.passk_advantages import max_rl_advantages, passk_advantages


def t(values):
    return torch.tensor(values, dtype=torch.float32)


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


# ---------------------------------------------------------------------------------- by hand
def test_opo_by_hand():
    rewards, lengths = t([1, 0, 1, 0, 1]), t([2, 4, 2, 3, 1])
    # group 1: baseline (2 + 0 + 2) / 8 = 0.5; group 2 (G = 2 rows of the next...) -> use G = 3 and G = 2 below
    close(opo_advantages(rewards[:3], 3, lengths=lengths[:3]), [0.5, -0.5, 0.5])
    close(opo_advantages(rewards[3:], 2, lengths=lengths[3:]), [-0.25, 0.75])  # baseline 1 / 4


def test_gpg_by_hand():
    # 3 non-zero rewards of 8: alpha = 8 / 3
    out = gpg_advantages(t([1, 0, 0, 0, 1, 1, 0, 0]), 4)
    close(out, [2.0, -2 / 3, -2 / 3, -2 / 3, 4 / 3, 4 / 3, -4 / 3, -4 / 3])
    close(gpg_advantages(t([1, 0, 0, 0]), 4, f_norm=2.0), [1.5, -0.5, -0.5, -0.5])  # alpha 4, / 2


def test_passk_by_hand():
    r = t([0.1, 0.7, 0.3, 0.5, 0.2, 0.9, 0.5, 0.9])
    std = math.sqrt(0.2 / 3)  # of [0.1, 0.7, 0.3, 0.5]
    close(passk_advantages(r, 4), [0.0, 0.2 / (std + 1e-6), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])  # tie at 0.9: gap 0
    close(passk_advantages(r, 4, scale_by_std=False), [0.0, 0.2, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])


def test_max_rl_by_hand():
    # (r - 0.25) / (0.25 + 1e-6) and (r - 0.75) / (0.75 + 1e-6): about 3, -1 and 1/3, -1
    e1, e2 = 0.25 + 1e-6, 0.75 + 1e-6
    close(
        max_rl_advantages(t([1, 0, 0, 0, 1, 1, 0, 1]), 4),
        [0.75 / e1, -0.25 / e1, -0.25 / e1, -0.25 / e1, 0.25 / e2, 0.25 / e2, -0.75 / e2, 0.25 / e2],
    )


# ---------------------------------------------------------------------------- loop references
def _groups(xs, g):
    return [xs[i : i + g] for i in range(0, len(xs), g)]


def ref_opo(r, g, lengths):
    out = []
    for grp, lens in zip(_groups(r, g), _groups(lengths, g)):
        base = sum(length * x for x, length in zip(grp, lens)) / sum(lens)
        out += [0.0 if max(grp) == min(grp) else x - base for x in grp]
    return out


def ref_gpg(r, g):
    alpha = len(r) / max(1, sum(1 for x in r if x != 0))
    return [0.0 if max(grp) == min(grp) else alpha * (x - sum(grp) / g) for grp in _groups(r, g) for x in grp]


def ref_passk(r, g, eps=1e-6):
    out = []
    for grp in _groups(r, g):
        best = grp.index(max(grp))
        second = max(x for i, x in enumerate(grp) if i != best)
        m = sum(grp) / g
        std = math.sqrt(sum((x - m) ** 2 for x in grp) / (g - 1))
        out += [(grp[best] - second) / (std + eps) if i == best else 0.0 for i in range(g)]
    return out


def ref_max_rl(r, g, eps=1e-6):
    out = []
    for grp in _groups(r, g):
        m = sum(grp) / g
        out += [0.0 if max(grp) == min(grp) else (x - m) / (m + eps) for x in grp]
    return out


#: Read by test_advantages.test_every_estimator_has_a_reference.
ESTIMATOR_REFERENCES = {"opo": ref_opo, "gpg": ref_gpg, "passk": ref_passk, "max_rl": ref_max_rl}


@pytest.mark.parametrize("name", sorted(ESTIMATOR_REFERENCES))
@pytest.mark.parametrize("g", [2, 3, 8])
def test_vectorised_matches_loop(name, g):
    gen = torch.Generator().manual_seed(99 + g)
    for trial in range(5):
        n = (1 + trial) * g
        r = (torch.randint(0, 65, (n,), generator=gen) / 64).to(torch.float32)  # exact in float32
        lengths = torch.randint(1, 9, (n,), generator=gen).float()
        kwargs = {"lengths": lengths} if name == "opo" else {}
        args = (lengths.tolist(),) if name == "opo" else ()
        close(ADVANTAGES.get(name)(r, g, **kwargs), ESTIMATOR_REFERENCES[name](r.tolist(), g, *args), atol=2e-5)


# ---------------------------------------------------------------------------------- edges
@pytest.mark.parametrize("name", sorted(ESTIMATOR_REFERENCES))
def test_all_equal_groups_are_exactly_zero(name):
    r = t([0.9, 0.9, 0.9, 0.3, 0.3, 0.3])
    kwargs = {"lengths": t([1, 2, 3, 4, 5, 6])} if name == "opo" else {}
    assert (ADVANTAGES.get(name)(r, 3, **kwargs) == 0).all()


def test_opo_is_marked_as_needing_lengths_and_requires_them():
    assert ADVANTAGES.spec("opo").needs_lengths
    assert not any(ADVANTAGES.spec(n).needs_lengths for n in ADVANTAGES.names() if n != "opo")
    with pytest.raises(TypeError, match="lengths"):
        opo_advantages(t([1, 0]), 2)


def test_passk_needs_two_samples_per_group():
    with pytest.raises(ValueError, match=r"advantage 'passk' divides by the std .* got group_size=1"):
        passk_advantages(t([1.0, 0.0]), 1)


def test_gpg_with_no_nonzero_reward_is_zero_and_finite():
    out = gpg_advantages(torch.zeros(6), 3)
    assert (out == 0).all()
