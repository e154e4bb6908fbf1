"""GRPO maths against numbers derived by hand (plain ``math``, or literals with the derivation alongside).

Nothing here re-runs the implementation's formulas through torch: expected values come from the
papers' definitions worked on small examples.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from vrl.rl.grpo import (
    GRPOConfig,
    group_advantages,
    informative_groups,
    is_fresh,
    policy_loss,
    weight_advantages,
)

LN = math.log


def flat(rows) -> list[float]:
    return [x for row in rows for x in row]


# -- group advantages --------------------------------------------------------------------------

REWARDS = [[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]]


def test_std_advantages_2x4():
    # group 0: mean 0.5, deviations +-0.5, unbiased var = 4 * 0.25 / 3 = 1/3, std = 0.57735
    #          -> +-0.5 / (0.57735 + 1e-4) = +-0.86588
    # group 1: mean 0.75, deviations (.25, .25, .25, -.75), var = (3 * .0625 + .5625) / 3 = .25, std = .5
    #          -> 0.25 / 0.5001 = 0.49990, -0.75 / 0.5001 = -1.49970
    a0 = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    a1, b1 = 0.25 / 0.5001, -0.75 / 0.5001
    assert a0 == pytest.approx(0.86588, abs=1e-5)
    got = group_advantages(torch.tensor(REWARDS), "std", 1e-4)
    assert flat(got.tolist()) == pytest.approx([a0, -a0, -a0, a0, a1, a1, a1, b1], abs=1e-6)


def test_mean_advantages_2x4():
    # Dr. GRPO: r - mean only; means 0.5 and 0.75
    got = group_advantages(torch.tensor(REWARDS), "mean")
    assert got.tolist() == [[0.5, -0.5, -0.5, 0.5], [0.25, 0.25, 0.25, -0.75]]  # exact in binary


@pytest.mark.parametrize("mode", ["std", "mean"])
def test_single_sample_group_has_zero_advantage(mode):
    got = group_advantages(torch.tensor([[3.0], [-1.0]]), mode)
    assert got.tolist() == [[0.0], [0.0]]  # no NaN from an unbiased std of one sample


@pytest.mark.parametrize("mode", ["std", "mean"])
def test_all_equal_group_is_zero_and_uninformative(mode):
    rewards = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
    got = group_advantages(rewards, mode)
    assert got[:2].tolist() == [[0.0] * 4] * 2
    assert informative_groups(rewards).tolist() == [False, False, True]
    assert informative_groups(torch.tensor(REWARDS)).tolist() == [True, True]


def test_group_advantages_rejects_bad_input():
    with pytest.raises(ValueError, match="num_groups"):
        group_advantages(torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match="mode"):
        group_advantages(torch.tensor(REWARDS), "rank")


# -- advantage weights -------------------------------------------------------------------------


def test_weight_advantages_scales_and_zeroes():
    adv = torch.tensor([[0.5, -0.5], [1.0, -2.0]])
    got = weight_advantages(adv, torch.tensor([2.0, 0.0]))
    assert got.tolist() == [[1.0, -1.0], [0.0, 0.0]]


@pytest.mark.parametrize("bad", [[1.0, -0.1], [1.0, math.nan], [math.inf, 1.0], [1.0]])
def test_weight_advantages_rejects_bad_weights(bad):
    with pytest.raises(ValueError, match="weights"):
        weight_advantages(torch.tensor([[0.5, -0.5], [1.0, -2.0]]), torch.tensor(bad))


finite = st.floats(-1e6, 1e6, allow_nan=False)


@given(st.lists(st.tuples(st.lists(finite, min_size=1, max_size=4), st.floats(0, 1e6)), min_size=1, max_size=4))
def test_weight_never_flips_a_sign(groups):
    width = max(len(g) for g, _ in groups)
    adv = torch.tensor([g + [0.0] * (width - len(g)) for g, _ in groups], dtype=torch.float64)
    weights = torch.tensor([w for _, w in groups], dtype=torch.float64)
    got = weight_advantages(adv, weights)
    assert bool((got * adv >= 0).all())  # same sign or zero, never opposite


# -- staleness ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rollout", "trainer", "max_staleness", "fresh"),
    [(5, 5, 4, True), (1, 5, 4, True), (0, 5, 4, False), (6, 5, 4, False), (5, 5, 0, True), (4, 5, 0, False)],
)
def test_is_fresh(rollout, trainer, max_staleness, fresh):
    assert is_fresh(rollout, trainer, max_staleness) is fresh


# -- config ------------------------------------------------------------------------------------


def test_config_defaults():
    c = GRPOConfig()
    assert (c.advantage, c.aggregation, c.eps_low, c.eps_high) == ("std", "token", 0.2, 0.28)
    assert (c.kl_beta, c.is_cap, c.std_eps, c.iterations) == (0.0, 2.0, 1e-4, 1)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("advantage", "rank"),
        ("aggregation", "mean"),
        ("eps_low", 0.0),
        ("eps_low", 1.0),
        ("eps_high", 0.0),
        ("eps_high", math.nan),
        ("kl_beta", -0.1),
        ("kl_beta", math.inf),
        ("is_cap", 0.5),
        ("iterations", 0),
        ("iterations", 1.5),
        ("iterations", True),
        ("std_eps", 0.0),
    ],
)
def test_config_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=rf"GRPOConfig\.{field}"):
        GRPOConfig(**{field: value})


# -- policy loss -------------------------------------------------------------------------------
#
# Two sequences, three slots, the last slot of sequence 1 padded (5 completion tokens).
# Advantages A = (+1, -0.5). Default clip range [0.8, 1.28], TIS cap 2.
#
#   token   r=pi/pi_old   A     r*A     clip(r)*A   min (surrogate)  clip binds?  pi_old/mu  w
#   (0,0)   1.0           +1    1.0     1.0         1.0              no           1          1
#   (0,1)   1.5           +1    1.5     1.28        1.28             yes          3          2 (truncated)
#   (0,2)   0.5           +1    0.5     0.8         0.5              no           0.5        0.5
#   (1,0)   0.5           -0.5  -0.25   -0.4        -0.4             yes          1.5        1.5
#   (1,1)   1.5           -0.5  -0.75   -0.64       -0.75            no           1          1
#
# per-token loss -w*surrogate: seq 0 (-1, -2.56, -0.25) sums to -3.81; seq 1 (0.6, 0.75) sums to 1.35
#   token:    (-3.81 + 1.35) / 5                 = -0.492
#   sequence: (-3.81 / 3 + 1.35 / 2) / 2         = (-1.27 + 0.675) / 2 = -0.2975
#   constant: (-3.81 + 1.35) / (2 sequences * 4) = -0.3075
# clip_fraction 2/5; is_weight_mean (1+2+0.5+1.5+1)/5 = 1.2; is_truncated_fraction 1/5.

OLD = [[-1.0, -2.0, -0.5], [-1.5, -0.7, 0.0]]
RATIO = [[1.0, 1.5, 0.5], [0.5, 1.5, 1.0]]
RAW_IS = [[1.0, 3.0, 0.5], [1.5, 1.0, 1.0]]
MASK = [[1, 1, 1], [1, 1, 0]]


def example():
    old = torch.tensor(OLD, dtype=torch.float64)
    logp = torch.tensor([[o + LN(r) for o, r in zip(orow, rrow)] for orow, rrow in zip(OLD, RATIO)],
                        dtype=torch.float64)
    mu = torch.tensor([[o - LN(w) for o, w in zip(orow, wrow)] for orow, wrow in zip(OLD, RAW_IS)], dtype=torch.float64)
    logp[1, 2], mu[1, 2], old[1, 2] = -math.inf, math.nan, math.inf  # padding holds garbage
    logp.requires_grad_(True)
    adv = torch.tensor([1.0, -0.5], dtype=torch.float64)
    return logp, mu, adv, torch.tensor(MASK, dtype=torch.bool), old


@pytest.mark.parametrize(("aggregation", "expected"), [("token", -0.492), ("sequence", -0.2975), ("constant", -0.3075)])
def test_policy_loss_value_per_aggregation(aggregation, expected):
    logp, mu, adv, mask, old = example()
    loss, stats = policy_loss(
        logp, mu, adv, mask, GRPOConfig(aggregation=aggregation), max_completion_tokens=4, old_logprobs=old
    )
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    assert stats["clip_fraction"] == pytest.approx(0.4)
    assert stats["is_weight_mean"] == pytest.approx(1.2)
    assert stats["is_truncated_fraction"] == pytest.approx(0.2)
    assert stats["tokens"] == 5.0 and stats["kl"] == 0.0
    assert all(isinstance(v, float) for v in stats.values())


def test_policy_loss_gradient_token_mean():
    # d/dlogp of -w*min(r*A, clip(r)*A)/N: -w*A*r/N on the unclipped branch (dr/dlogp = r), 0 where clipped
    #   (0,0) -1*1*1/5 = -0.2   (0,1) clipped 0   (0,2) -0.5*1*0.5/5 = -0.05
    #   (1,0) clipped 0         (1,1) -1*(-0.5)*1.5/5 = 0.15            (1,2) padding 0
    logp, mu, adv, mask, old = example()
    loss, _ = policy_loss(logp, mu, adv, mask, GRPOConfig(), old_logprobs=old)
    (grad,) = torch.autograd.grad(loss, logp)
    assert flat(grad.tolist()) == pytest.approx([-0.2, 0.0, -0.05, 0.0, 0.15, 0.0], abs=1e-12)


def test_single_step_is_on_policy_ratio():
    # old_logprobs omitted: pi_old = logprobs.detach(), so r = 1 and the clip never binds;
    # loss = -sum(w*A)/N = -(1 + 2 + 0.5 - 0.5*1.5 - 0.5*1)/5 = -2.25/5 = -0.45, grad = -w*A/N
    logp, _, adv, mask, _ = example()
    mu = logp.detach() - torch.tensor(RAW_IS, dtype=torch.float64).log()  # same pi_old/mu as the table
    loss, stats = policy_loss(logp, mu, adv, mask, GRPOConfig())
    assert loss.item() == pytest.approx(-0.45, abs=1e-12)
    assert stats["clip_fraction"] == 0.0
    (grad,) = torch.autograd.grad(loss, logp)
    assert flat(grad.tolist()) == pytest.approx([-0.2, -0.4, -0.1, 0.15, 0.1, 0.0], abs=1e-12)


def test_k3_kl_value_and_gradient():
    # log(ref/pi) d = (ln 2, -ln 2, 0): k3 = e^d - d - 1 = (1 - ln 2, ln 2 - 0.5, 0) = (0.306853, 0.193147, 0)
    # mean = 0.5 / 3 = 1/6; with A = 0 the loss is beta * 1/6. dk3/dlogp = 1 - e^d = (-1, 0.5, 0), times beta/3.
    logp = torch.tensor([[-1.0, -2.0, -0.3]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-1.0 + LN(2), -2.0 - LN(2), -0.3]], dtype=torch.float64)
    mask, zero = torch.ones(1, 3), torch.zeros(1, dtype=torch.float64)
    loss, stats = policy_loss(logp, logp.detach(), zero, mask, GRPOConfig(kl_beta=0.1), ref_logprobs=ref)
    assert stats["kl"] == pytest.approx(1 / 6, abs=1e-12)
    assert loss.item() == pytest.approx(0.1 / 6, abs=1e-12)
    (grad,) = torch.autograd.grad(loss, logp)
    assert grad[0].tolist() == pytest.approx([-0.1 / 3, 0.05 / 3, 0.0], abs=1e-12)
    _, same = policy_loss(logp, logp.detach(), zero, mask, GRPOConfig(kl_beta=0.1), ref_logprobs=logp.detach())
    assert same["kl"] == 0.0


@given(st.lists(st.tuples(st.floats(-20, 0), st.floats(-20, 0)), min_size=1, max_size=8))
def test_k3_is_never_negative(pairs):
    logp = torch.tensor([[p for p, _ in pairs]], dtype=torch.float64)
    ref = torch.tensor([[q for _, q in pairs]], dtype=torch.float64)
    zero = torch.zeros(1, dtype=torch.float64)
    _, stats = policy_loss(logp, logp, zero, torch.ones_like(logp), GRPOConfig(), ref_logprobs=ref)
    assert stats["kl"] >= 0.0


def test_policy_loss_rejects_missing_inputs():
    logp, mu, adv, mask, _ = example()
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(logp, mu, adv, mask, GRPOConfig(kl_beta=0.04))
    with pytest.raises(ValueError, match="max_completion_tokens"):
        policy_loss(logp, mu, adv, mask, GRPOConfig(aggregation="constant"))
    with pytest.raises(ValueError, match="behaviour_logprobs"):
        policy_loss(logp, mu[:, :2], adv, mask, GRPOConfig())
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(logp, mu, adv[:1], mask, GRPOConfig())
