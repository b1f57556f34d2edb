"""Advantage estimators and multi-reward aggregation: hand-worked values, loop references, edges."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

from lightning_grpo.core.advantages import (
    as_groups,
    expand_to_tokens,
    grpo_advantages,
    normalize_then_sum,
    qae_advantages,
    reinforce_pp_baseline_advantages,
    sum_then_normalize,
)
from lightning_grpo.core.registry import ADVANTAGES, REWARD_AGGREGATIONS
from tests.core import EPS, close, t


# ----------------------------------------------------------------------------------------------
# registry
# ----------------------------------------------------------------------------------------------
def test_registered_names():
    assert set(ADVANTAGES.names()) >= {"grpo", "dr_grpo", "batch_std", "rloo", "reinforce_pp_baseline", "qae"}
    assert ADVANTAGES.get("grpo") is grpo_advantages
    assert ADVANTAGES.get("qae") is qae_advantages
    assert set(REWARD_AGGREGATIONS.names()) >= {"sum_then_normalize", "normalize_then_sum"}


# ----------------------------------------------------------------------------------------------
# hand-worked values
# ----------------------------------------------------------------------------------------------
def test_grpo_hand():
    # group 1: [1, 0, 0, 1]: mean 0.5, Bessel var (4 * 0.25) / 3 = 1/3, std sqrt(1/3)
    # group 2: [2, 2, 2, 2]: all equal -> 0
    s = math.sqrt(1 / 3)
    a = 0.5 / (s + EPS)
    close(ADVANTAGES.get("grpo")(t([1, 0, 0, 1, 2, 2, 2, 2]), 4), [a, -a, -a, a, 0, 0, 0, 0])


def test_grpo_eps_param():
    # [3, 1]: mean 2, std sqrt(((1)^2 + (-1)^2) / 1) = sqrt(2); eps = 0.5
    d = math.sqrt(2) + 0.5
    close(grpo_advantages(t([3, 1]), 2, eps=0.5), [1 / d, -1 / d])


def test_dr_grpo_hand():
    # [1,0,0,1] mean 0.5; [3,1,2,2] mean 2
    close(ADVANTAGES.get("dr_grpo")(t([1, 0, 0, 1, 3, 1, 2, 2]), 4), [0.5, -0.5, -0.5, 0.5, 1, -1, 0, 0])


def test_batch_std_hand():
    # centred: [.5,-.5,-.5,.5, 1,-1,0,0]; batch mean of rewards 10/8 = 1.25,
    # squared deviations .0625+1.5625+1.5625+.0625+3.0625+.0625+.5625+.5625 = 7.5, var 7.5/7
    s = math.sqrt(7.5 / 7)
    c = [0.5, -0.5, -0.5, 0.5, 1.0, -1.0, 0.0, 0.0]
    close(ADVANTAGES.get("batch_std")(t([1, 0, 0, 1, 3, 1, 2, 2]), 4), [x / (s + EPS) for x in c])


def test_rloo_hand():
    # r_0 - mean(others) = 1 - (0 + 0 + 1)/3 = 2/3; r_1 = 0 - (1 + 0 + 1)/3 = -2/3
    # [3,1,2,2]: 3 - 5/3 = 4/3; 1 - 7/3 = -4/3; 2 - 6/3 = 0
    out = ADVANTAGES.get("rloo")(t([1, 0, 0, 1, 3, 1, 2, 2]), 4)
    close(out, [2 / 3, -2 / 3, -2 / 3, 2 / 3, 4 / 3, -4 / 3, 0, 0])


def test_reinforce_pp_baseline_hand():
    # x = [.5,-.5,-.5,.5, 1,-1,0,0], mean 0, Bessel var (4 * .25 + 1 + 1) / 7 = 3/7
    s = math.sqrt(3 / 7)
    x = [0.5, -0.5, -0.5, 0.5, 1.0, -1.0, 0.0, 0.0]
    out = ADVANTAGES.get("reinforce_pp_baseline")(t([1, 0, 0, 1, 3, 1, 2, 2]), 4)
    close(out, [v / (s + EPS) for v in x])


def test_reinforce_pp_baseline_shifts_nonzero_mean():
    # groups of 2: [1, 0] -> x = [.5, -.5]; [5, 5] -> [0, 0]; [0, 3] -> [-1.5, 1.5]
    # x mean 0; all group means 0 so mean(x) = 0; var (.25 + .25 + 2.25 + 2.25) / 5 = 1
    out = reinforce_pp_baseline_advantages(t([1, 0, 5, 5, 0, 3]), 2)
    close(out, [0.5 / (1 + EPS), -0.5 / (1 + EPS), 0, 0, -1.5 / (1 + EPS), 1.5 / (1 + EPS)])


def test_qae_hand_binary_default_k():
    # K = 0.4, G = 4, inverted CDF: index ceil(0.4 * 4) - 1 = 1 of the sorted group
    # [1,0,0,0]: sorted [0,0,0,1] -> q = 0 -> [1,0,0,0]     (p = .25 <= .6: successes only)
    # [1,1,0,0]: sorted [0,0,1,1] -> q = 0 -> [1,1,0,0]     (p = .5 <= .6)
    # [1,1,1,0]: sorted [0,1,1,1] -> q = 1 -> [0,0,0,-1]    (p = .75 > .6: failures only)
    out = ADVANTAGES.get("qae")(t([1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0]), 4)
    close(out, [1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, -1])


def test_qae_hand_continuous_and_std():
    # [.3,.9,.1,.5,.7], K = .4, G = 5: ceil(2) - 1 = 1 -> sorted [.1,.3,.5,.7,.9][1] = .3
    r = t([0.3, 0.9, 0.1, 0.5, 0.7])
    close(qae_advantages(r, 5), [0.0, 0.6, -0.2, 0.2, 0.4])
    # std: mean .5, squared deviations .04+.16+.16+0+.04 = .4, Bessel var .1
    s = math.sqrt(0.1) + EPS
    close(qae_advantages(r, 5, scale_by_std=True), [0.0, 0.6 / s, -0.2 / s, 0.2 / s, 0.4 / s])
    # K = .8: ceil(4) - 1 = 3 -> .7
    close(qae_advantages(r, 5, quantile=0.8), [-0.4, 0.2, -0.6, -0.2, 0.0])


def test_qae_linear_interpolation_matches_authors_code():
    # torch.quantile default: position K * (G - 1) = 0.4 * 3 = 1.2 in sorted [0,0,1,1]
    # -> 0 + 0.2 * (1 - 0) = 0.2; advantages [.8, .8, -.2, -.2] (both sides nonzero)
    out = qae_advantages(t([1, 1, 0, 0]), 4, interpolation="linear")
    close(out, [0.8, 0.8, -0.2, -0.2])


@pytest.mark.parametrize("k", ["0.2", "0.25", "0.4", "0.5", "0.6", "0.7", "0.8"])
def test_qae_two_regime_gate(k):
    """0/1 rewards, success rate p: p <= 1-K -> only successes nonzero; p > 1-K -> only failures."""
    kf = Fraction(k)
    for g in range(1, 11):
        for n_success in range(g + 1):
            r = t([1.0] * n_success + [0.0] * (g - n_success))
            adv = qae_advantages(r, g, quantile=float(k))
            succ, fail = adv[:n_success], adv[n_success:]
            if 0 < n_success < g and Fraction(n_success, g) <= 1 - kf:
                close(succ, [1.0] * n_success)
                close(fail, [0.0] * (g - n_success))
            elif 0 < n_success < g:
                close(succ, [0.0] * n_success)
                close(fail, [-1.0] * (g - n_success))
            else:
                close(adv, [0.0] * g)


def test_qae_validation():
    with pytest.raises(ValueError, match="quantile"):
        qae_advantages(t([1, 0]), 2, quantile=1.5)
    with pytest.raises(ValueError, match="interpolation"):
        qae_advantages(t([1, 0]), 2, interpolation="cubic")


def test_sum_then_normalize_hand():
    # rewards [[1,0],[0,0],[0,1],[1,1]], w = [1, .5] -> s = [1, 0, .5, 1.5], mean .75,
    # deviations [.25,-.75,-.25,.75], Bessel var (.0625+.5625+.0625+.5625)/3 = 5/12
    rw = t([[1, 0], [0, 0], [0, 1], [1, 1]])
    s = math.sqrt(5 / 12) + EPS
    out = REWARD_AGGREGATIONS.get("sum_then_normalize")(rw, t([1.0, 0.5]), 4)
    close(out, [0.25 / s, -0.75 / s, -0.25 / s, 0.75 / s])
    # estimator by name: dr_grpo -> plain deviations
    close(sum_then_normalize(rw, [1.0, 0.5], 4, estimator="dr_grpo"), [0.25, -0.75, -0.25, 0.75])


def test_normalize_then_sum_hand():
    # column 0 [1,0,0,1] -> [.5,-.5,-.5,.5] * c, column 1 [0,0,1,1] -> [-.5,-.5,.5,.5] * c,
    # c = 1 / (sqrt(1/3) + eps). S = A0 + .5 * A1 = c * [.25, -.75, -.25, .75]
    rw = t([[1, 0], [0, 0], [0, 1], [1, 1]])
    c = 1 / (math.sqrt(1 / 3) + EPS)
    plain = [c * 0.25, c * -0.75, c * -0.25, c * 0.75]
    out = REWARD_AGGREGATIONS.get("normalize_then_sum")(rw, t([1.0, 0.5]), 4, batch_normalize=False)
    close(out, plain)
    # batch whitening: mean 0, std c * sqrt(5/12)
    s = c * math.sqrt(5 / 12) + EPS
    close(normalize_then_sum(rw, t([1.0, 0.5]), 4), [v / s for v in plain])
    # estimator by name with its own params: rloo (G/(G-1) = 4/3)
    out = normalize_then_sum(rw, t([1.0, 0.5]), 4, estimator="rloo", batch_normalize=False)
    close(out, [4 / 3 * 0.25, 4 / 3 * -0.75, 4 / 3 * -0.25, 4 / 3 * 0.75])
    out = normalize_then_sum(rw, t([1.0, 0.5]), 4, estimator="grpo", eps=1.0, batch_normalize=False)
    c1 = 1 / (math.sqrt(1 / 3) + 1.0)
    close(out, [c1 * 0.25, c1 * -0.75, c1 * -0.25, c1 * 0.75])


def test_aggregation_validation():
    with pytest.raises(ValueError, match="weights"):
        sum_then_normalize(torch.zeros(4, 2), t([1.0, 2.0, 3.0]), 4)
    with pytest.raises(ValueError, match=r"\[B, R\]"):
        normalize_then_sum(torch.zeros(4), t([1.0]), 4)
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        sum_then_normalize(torch.zeros(4, 2), t([1.0, 1.0]), 4, estimator="nope")


def test_expand_to_tokens():
    mask = torch.tensor([[True, True, False], [False, False, False]])
    close(expand_to_tokens(t([2.0, -1.0]), mask), [[2.0, 2.0, 0.0], [0.0, 0.0, 0.0]])


# ----------------------------------------------------------------------------------------------
# plain Python loop references on random inputs
# ----------------------------------------------------------------------------------------------
def _mean(xs):
    return sum(xs) / len(xs)


def _std(xs):
    if len(xs) < 2:
        return 0.0
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _groups(r, g):
    return [r[i : i + g] for i in range(0, len(r), g)]


def ref_grpo(r, g, eps=EPS):
    return [(x - _mean(grp)) / (_std(grp) + eps) for grp in _groups(r, g) for x in grp]


def ref_dr_grpo(r, g):
    return [x - _mean(grp) for grp in _groups(r, g) for x in grp]


def ref_batch_std(r, g, eps=EPS):
    s = _std(r)
    return [(x - _mean(grp)) / (s + eps) for grp in _groups(r, g) for x in grp]


def ref_rloo(r, g):
    if g == 1:
        return [0.0] * len(r)
    return [x - (sum(grp) - x) / (g - 1) for grp in _groups(r, g) for x in grp]


def ref_reinforce_pp(r, g, eps=EPS):
    xs = ref_dr_grpo(r, g)
    m, s = _mean(xs), _std(xs)
    return [(x - m) / (s + eps) for x in xs]


def ref_qae(r, g, quantile=0.4):
    out = []
    for grp in _groups(r, g):
        srt = sorted(grp)
        # smallest value whose empirical CDF (#values <= v)/G reaches K
        q = next(v for v in srt if Fraction(sum(1 for w in grp if w <= v), g) >= Fraction(str(quantile)))
        out += [x - q for x in grp]
    return out


REFERENCES = {
    "grpo": ref_grpo,
    "dr_grpo": ref_dr_grpo,
    "batch_std": ref_batch_std,
    "rloo": ref_rloo,
    "reinforce_pp_baseline": ref_reinforce_pp,
    "qae": ref_qae,
}


def test_every_estimator_has_a_reference():
    from .test_advantage_estimators import ESTIMATOR_REFERENCES

    # the package's estimators (a docs example run in the same session registers one of its own)
    builtin = {n for n in ADVANTAGES.names() if ADVANTAGES.get(n).__module__.startswith("lightning_grpo.")}
    assert set(REFERENCES) | set(ESTIMATOR_REFERENCES) == builtin


@pytest.mark.parametrize("name", sorted(REFERENCES))
@pytest.mark.parametrize("g", [1, 2, 3, 5, 8])
def test_vectorised_matches_loop(name, g):
    if g == 1 and name in STD_ESTIMATORS:  # a group of one has no std
        with pytest.raises(ValueError, match="needs group_size >= 2"):
            ADVANTAGES.get(name)(torch.zeros(3), g)
        return
    gen = torch.Generator().manual_seed(1234 + g)
    for trial in range(5):
        p = 1 + trial
        # continuous rewards in [0, 1]; values with a float32-exact representation (k/64)
        r = (torch.randint(0, 65, (p * g,), generator=gen) / 64).to(torch.float32)
        expected = REFERENCES[name](r.tolist(), g)
        close(ADVANTAGES.get(name)(r, g), expected)


@pytest.mark.parametrize("k", [0.1, 0.3, 0.5, 0.75, 0.9])
def test_qae_loop_other_quantiles(k):
    gen = torch.Generator().manual_seed(7)
    r = torch.rand(6 * 7, generator=gen)
    close(qae_advantages(r, 7, quantile=k), ref_qae(r.tolist(), 7, quantile=k))


# ----------------------------------------------------------------------------------------------
# edge cases
# ----------------------------------------------------------------------------------------------
#: Estimators that divide by the group's std: a group of one is an error, not A = 0.
STD_ESTIMATORS = {"grpo"}


@pytest.mark.parametrize("name", sorted(set(REFERENCES) - STD_ESTIMATORS))
def test_group_of_one_is_zero(name):
    out = ADVANTAGES.get(name)(t([0.3, 1.0, -2.0]), 1)
    close(out, [0.0, 0.0, 0.0])
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name,params", [("grpo", {}), ("qae", {"scale_by_std": True})])
def test_group_of_one_with_std_raises(name, params):
    with pytest.raises(
        ValueError, match=rf"advantage '{name}' divides by the std .* needs group_size >= 2 .* got group_size=1"
    ):
        ADVANTAGES.get(name)(t([0.3, 1.0, -2.0]), 1, **params)
    assert ADVANTAGES.get(name)(torch.zeros(0), 1, **params).shape == (0,)  # nothing to normalise


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_all_equal_groups_are_zero(name):
    # float32 mean of three 0.9s is one ulp off 0.9 (and of seven 0.3s likewise): without the
    # constant-group guard grpo would give 6e-8 / (std ~ 0 + 1e-6) ~ 0.06 instead of 0
    out = ADVANTAGES.get(name)(t([0.9, 0.9, 0.9, 0.7, 0.7, 0.7]), 3)
    close(out, [0.0] * 6)
    close(ADVANTAGES.get(name)(t([0.3] * 7), 7), [0.0] * 7)


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_single_group_and_bf16(name):
    r32 = t([1, 0, 0, 1, 0.5, 0.25])
    out = ADVANTAGES.get(name)(r32.to(torch.bfloat16), 6)  # these values are bf16-exact
    close(out, ADVANTAGES.get(name)(r32, 6))
    close(out, REFERENCES[name](r32.tolist(), 6))


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_integer_rewards_and_empty_batch(name):
    close(ADVANTAGES.get(name)(torch.tensor([1, 0, 0, 1]), 2), REFERENCES[name]([1.0, 0.0, 0.0, 1.0], 2))
    assert ADVANTAGES.get(name)(torch.zeros(0), 4).shape == (0,)


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_batch_not_divisible_by_group_size(name):
    with pytest.raises(ValueError, match=r"B=5.*group_size=2"):
        ADVANTAGES.get(name)(torch.zeros(5), 2)


def test_as_groups_validation():
    with pytest.raises(ValueError, match="group_size"):
        as_groups(torch.zeros(4), 0)
    with pytest.raises(ValueError, match="1-D"):
        as_groups(torch.zeros(4, 1), 2)
    assert as_groups(torch.zeros(6, dtype=torch.float16), 3).shape == (2, 3)


def test_aggregations_edges():
    # G = 1 and a one-row batch: no nan anywhere (with an estimator that needs no group std)
    rw = t([[1.0, 2.0]])
    for name in REWARD_AGGREGATIONS.names():
        close(REWARD_AGGREGATIONS.get(name)(rw, t([1.0, 1.0]), 1, estimator="dr_grpo"), [0.0])
        close(REWARD_AGGREGATIONS.get(name)(rw.to(torch.bfloat16), t([1.0, 1.0]), 1, estimator="dr_grpo"), [0.0])
        with pytest.raises(ValueError, match=r"advantage 'grpo' divides by the std"):
            REWARD_AGGREGATIONS.get(name)(rw, t([1.0, 1.0]), 1)


def test_batch_whitened_estimators_keep_all_equal_groups_at_exactly_zero():
    """The batch mean of the centred rewards is 0 only up to float rounding (-1.2e-8 after
    whitening these rewards without the exact-zero step); the all-equal group [0.3, 0.3, 0.3] must stay at 0."""
    r = t([0.1, 0.2, 0.7, 0.3, 0.3, 0.3, 0.9, 0.05, 0.33])
    assert reinforce_pp_baseline_advantages(r, 3)[3:6].tolist() == [0.0, 0.0, 0.0]
    rw = torch.stack([r, t([0.3, 0.7, 0.11, 0.5, 0.5, 0.5, 0.2, 0.9, 0.4])], 1)
    assert normalize_then_sum(rw, t([1.0, 0.5]), 3)[3:6].tolist() == [0.0, 0.0, 0.0]
    assert normalize_then_sum(rw, t([1.0, 0.5]), 3, estimator="qae")[3:6].tolist() == [0.0, 0.0, 0.0]
    # a group constant in one reward but not in the other still carries signal
    assert normalize_then_sum(rw, t([1.0, 0.5]), 3)[0:3].abs().min() > 0.1
