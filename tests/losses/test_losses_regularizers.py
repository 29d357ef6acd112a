"""Regularizers against hand values: entropy bonus, KL to the reference (k1/k2/k3), TEPO v2's KL mask."""

from __future__ import annotations

import math

import pytest
import torch

from loss_cases import pad
from tepo.losses import compute_policy_loss, kl_estimate

E = math.exp

# Two rows, T=3, row 1 padded. logp == old, so r = 1 and the policy loss is simple: -A per token.
LOGP = [[-1.0, -0.5, -2.0], [-0.2, -1.2]]
REF = [[-1.3, -0.4, -2.5], [-0.2, -0.7]]
ENT = [[1.5, 0.3, 2.0], [0.8, 1.1]]
ADV = [0.5, -1.0]
T_TOT, N = 5, 2


def _inputs(**overrides):
    base = {
        "logp": pad(LOGP).requires_grad_(True),
        "old_logp": pad(LOGP),
        "advantages": torch.tensor(ADV, dtype=torch.float64),
        "mask": torch.tensor([[1, 1, 1], [1, 1, 0]]),
    }
    base.update(overrides)
    return base


POLICY_TOKEN_MEAN = -(3 * 0.5 + 2 * -1.0) / T_TOT  # dapo at r = 1


def test_kl_estimators_formulas():
    logp = torch.tensor([-1.0, -0.5, -2.0], dtype=torch.float64)
    ref = torch.tensor([-1.3, -0.4, -2.5], dtype=torch.float64)
    d = [-0.3, 0.1, -0.5]  # ref - logp
    torch.testing.assert_close(
        kl_estimate(logp, ref, "k1"), torch.tensor([0.3, -0.1, 0.5], dtype=torch.float64)
    )
    torch.testing.assert_close(
        kl_estimate(logp, ref, "k2"), torch.tensor([x * x / 2 for x in d], dtype=torch.float64)
    )
    torch.testing.assert_close(
        kl_estimate(logp, ref, "k3"), torch.tensor([E(x) - x - 1 for x in d], dtype=torch.float64)
    )
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_estimate(logp, ref, "k4")


@pytest.mark.parametrize(
    ("estimator", "value", "dvalue"),
    [
        # per token with x = ref - logp: the estimate, and its derivative w.r.t. logp
        ("k1", lambda x: -x, lambda x: 1.0),
        ("k2", lambda x: x * x / 2, lambda x: -x),
        ("k3", lambda x: E(x) - x - 1, lambda x: 1 - E(x)),
    ],
)
def test_kl_coef_adds_coef_times_aggregated_kl(estimator, value, dvalue):
    coef = 0.25
    inputs = _inputs(ref_logp=pad(REF))
    loss, metrics = compute_policy_loss("dapo", **inputs, kl_coef=coef, kl_estimator=estimator)
    loss.backward()
    xs = [[r - lp for r, lp in zip(rr, lr)] for rr, lr in zip(REF, LOGP)]
    kl = sum(value(x) for row in xs for x in row) / T_TOT
    assert loss.item() == pytest.approx(POLICY_TOKEN_MEAN + coef * kl, rel=1e-12)
    assert metrics["kl_ref"] == pytest.approx(kl, rel=1e-12)
    assert metrics["policy_loss"] == pytest.approx(POLICY_TOKEN_MEAN, rel=1e-12)
    expected = [[(-ADV[i] + coef * dvalue(x)) / T_TOT for x in row] for i, row in enumerate(xs)]
    torch.testing.assert_close(inputs["logp"].grad, pad(expected, 0.0))


def test_kl_uses_the_loss_aggregation():
    inputs = _inputs(ref_logp=pad(REF))
    loss, _ = compute_policy_loss("grpo", **inputs, kl_coef=1.0, kl_estimator="k1")  # seq-mean-token-mean
    k1 = [[lp - r for r, lp in zip(rr, lr)] for rr, lr in zip(REF, LOGP)]
    policy = -(0.5 + -1.0) / N
    assert loss.item() == pytest.approx(policy + (sum(k1[0]) / 3 + sum(k1[1]) / 2) / N, rel=1e-12)


def test_entropy_coef_subtracts_coef_times_aggregated_entropy():
    coef = 0.1
    entropy = pad(ENT).requires_grad_(True)
    inputs = _inputs(entropy=entropy)
    loss, metrics = compute_policy_loss("dapo", **inputs, entropy_coef=coef)
    loss.backward()
    mean_h = sum(sum(r) for r in ENT) / T_TOT
    assert loss.item() == pytest.approx(POLICY_TOKEN_MEAN - coef * mean_h, rel=1e-12)
    assert metrics["entropy_bonus"] == pytest.approx(-coef * mean_h, rel=1e-12)
    assert metrics["entropy"] == pytest.approx(mean_h, rel=1e-12)
    torch.testing.assert_close(entropy.grad, pad([[-coef / T_TOT] * 3, [-coef / T_TOT] * 2], 0.0))


def test_tepo_kl_mask_counts_only_positive_advantage_and_falling_entropy():
    # Row 0 (A>0): H vs H_old -> falling, rising, falling  => tokens (0,0), (0,2) are in M.
    # Row 1 (A<0): falling entropy but negative advantage => none in M.
    old = [[-1.2, -0.1, -2.3], [-0.5, -1.0]]
    old_ent = [[1.6, 0.2, 2.5], [0.9, 1.5]]
    coef = 2.0
    inputs = _inputs(old_logp=pad(old), entropy=pad(ENT), old_entropy=pad(old_ent))
    loss, metrics = compute_policy_loss("dapo", **inputs, eps=10.0, tepo_kl_mask_coef=coef)
    loss.backward()
    x = [[o - lp for o, lp in zip(orow, lrow)] for orow, lrow in zip(old, LOGP)]  # old - logp
    in_set = [(0, 0), (0, 2)]
    k3 = sum(E(x[i][t]) - x[i][t] - 1 for i, t in in_set) / T_TOT
    policy = -sum(E(-x[i][t]) * ADV[i] for i in range(2) for t in range(len(x[i]))) / T_TOT
    assert loss.item() == pytest.approx(policy + coef * k3, rel=1e-12)
    assert metrics["tepo_kl_mask"] == pytest.approx(k3, rel=1e-12)
    assert metrics["tepo_kl_mask_frac"] == pytest.approx(2 / 5)
    expected = [[-E(-x[i][t]) * ADV[i] / T_TOT for t in range(len(x[i]))] for i in range(2)]
    for i, t in in_set:  # d k3 / d logp = 1 - exp(old - logp)
        expected[i][t] += coef * (1 - E(x[i][t])) / T_TOT
    torch.testing.assert_close(inputs["logp"].grad, pad(expected, 0.0))


def test_tepo_kl_mask_divides_by_global_token_count_whatever_the_aggregation():
    old = [[-1.2, -0.1, -2.3], [-0.5, -1.0]]
    inputs = _inputs(old_logp=pad(old), entropy=pad(ENT), old_entropy=pad(ENT, 9.0) + 1.0)  # all falling
    _, metrics = compute_policy_loss("grpo", **inputs, num_tokens=50, tepo_kl_mask_coef=1.0)
    x = [o - lp for o, lp in zip(old[0], LOGP[0])]  # only row 0 has A > 0
    assert metrics["tepo_kl_mask"] == pytest.approx(sum(E(v) - v - 1 for v in x) / 50, rel=1e-12)


@pytest.mark.parametrize(
    ("estimator", "value", "slope"),
    [
        # x = old - logp; value per token and d value / d logp
        ("k3", lambda x: E(x) - x - 1, lambda x: 1 - E(x)),
        ("k2", lambda x: x * x / 2, lambda x: -x),
        ("k3+", lambda x: E(x) - x - 1, lambda x: -x),  # k3's value, k2's gradient
        ("k1", lambda x: -x, lambda x: 1.0),
    ],
)
def test_tepo_kl_mask_estimator_sets_value_and_gradient(estimator, value, slope):
    old = [[-1.2, -0.1, -2.3], [-0.5, -1.0]]
    old_ent = [[1.6, 0.2, 2.5], [0.9, 1.5]]  # M = {(0, 0), (0, 2)}, as in the test above
    coef = 2.0
    inputs = _inputs(old_logp=pad(old), entropy=pad(ENT), old_entropy=pad(old_ent))
    options = {"tepo_kl_mask_coef": coef, "tepo_kl_mask_estimator": estimator}
    loss, metrics = compute_policy_loss("dapo", **inputs, eps=10.0, **options)
    loss.backward()
    x = [[o - lp for o, lp in zip(orow, lrow)] for orow, lrow in zip(old, LOGP)]
    in_set = [(0, 0), (0, 2)]
    assert metrics["tepo_kl_mask"] == pytest.approx(sum(value(x[i][t]) for i, t in in_set) / T_TOT, rel=1e-12)
    expected = [[-E(-x[i][t]) * ADV[i] / T_TOT for t in range(len(x[i]))] for i in range(2)]
    for i, t in in_set:
        expected[i][t] += coef * slope(x[i][t]) / T_TOT
    torch.testing.assert_close(inputs["logp"].grad, pad(expected, 0.0))


def test_tepo_kl_mask_k3_gradient_grows_exponentially_where_k2_stays_linear():
    # One token of M whose probability the previous update cut by e^7 (about 1100x): the spike of the study.
    logp = torch.tensor([[-8.0]], dtype=torch.float64)
    grads = {}
    for estimator in ("k3", "k2"):
        inputs = _inputs(
            logp=logp.clone().requires_grad_(True),
            old_logp=torch.tensor([[-1.0]], dtype=torch.float64),
            advantages=torch.tensor([1.0], dtype=torch.float64),
            mask=torch.ones(1, 1),
            entropy=torch.tensor([[0.1]], dtype=torch.float64),
            old_entropy=torch.tensor([[0.5]], dtype=torch.float64),
        )
        loss, _ = compute_policy_loss(
            "dapo", **inputs, eps=10.0, tepo_kl_mask_coef=1.0, tepo_kl_mask_estimator=estimator
        )
        loss.backward()
        grads[estimator] = inputs["logp"].grad.item() + E(-7.0)  # minus the policy term's -r * A
    assert grads["k3"] == pytest.approx(1 - E(7.0), rel=1e-12)
    assert grads["k2"] == pytest.approx(-7.0, rel=1e-12)


def test_unknown_tepo_kl_mask_estimator_is_refused():
    with pytest.raises(ValueError, match="unknown tepo_kl_mask_estimator 'k9'"):
        compute_policy_loss(
            "tepo",
            **_inputs(entropy=pad(ENT), old_entropy=pad(ENT)),
            tepo_kl_mask_coef=0.1,
            tepo_kl_mask_estimator="k9",
        )


@pytest.mark.parametrize(
    ("options", "missing"),
    [
        ({"kl_coef": 0.1}, "ref_logp"),
        ({"entropy_coef": 0.01}, "entropy"),
        ({"tepo_kl_mask_coef": 0.1}, "entropy"),
    ],
)
def test_regularizer_without_its_tensor_raises(options, missing):
    with pytest.raises(ValueError, match=missing):
        compute_policy_loss("tepo", **_inputs(), **options)


def test_tepo_kl_mask_without_old_entropy_raises():
    with pytest.raises(ValueError, match="old_entropy"):
        compute_policy_loss("tepo", **_inputs(entropy=pad(ENT)), tepo_kl_mask_coef=0.1)


def test_bad_regularizer_settings_raise():
    with pytest.raises(ValueError, match="k1, k2, k3"):
        compute_policy_loss("tepo", **_inputs(ref_logp=pad(REF)), kl_coef=0.1, kl_estimator="k5")
    with pytest.raises(ValueError, match="kl_coef must be >= 0"):
        compute_policy_loss("tepo", **_inputs(ref_logp=pad(REF)), kl_coef=-1.0)
    with pytest.raises(ValueError, match="entropy_coef must be a finite number"):
        compute_policy_loss("tepo", **_inputs(entropy=pad(ENT)), entropy_coef=float("nan"))
