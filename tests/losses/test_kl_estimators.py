"""The 2026 KL estimators against hand values: ``k3_unbiased`` (DeepSeek-V3.2, TRL ``use_bias_correction_kl``)
and verl's straight-through ``k1+``/``k2+``/``k3+``: values, gradients, micro-batch invariance, refusals."""

from __future__ import annotations

import math

import pytest
import torch

from helpers import config_error_lines
from loss_cases import loss_on_rows, pad
from tepo.config import load_config
from tepo.losses import KL_ESTIMATORS, compute_policy_loss, kl_estimate

E = math.exp

# Two rows, T = 3, row 1 padded (NaN padding must not matter).
LOGP = [[-1.0, -0.5, -2.0], [-0.2, -1.2]]
OLD = [[-1.1, -0.3, -2.2], [-0.6, -1.0]]
REF = [[-1.3, -0.4, -2.5], [-0.2, -0.7]]
ADV = [0.5, -1.0]
T_TOT = 5


def _flat(rows):
    return torch.tensor([x for row in rows for x in row], dtype=torch.float64)


def _estimate_and_grad(estimator):
    logp = _flat(LOGP).requires_grad_(True)
    value = kl_estimate(logp, _flat(REF), estimator, old_logp=_flat(OLD))
    value.sum().backward()
    return value.detach(), logp.grad


def test_the_new_names_are_registered_after_the_classic_three():
    assert KL_ESTIMATORS == ("k1", "k2", "k3", "k3_unbiased", "k1+", "k2+", "k3+")


def test_k3_unbiased_is_the_ratio_times_k3_with_the_gradient_through_the_ratio():
    value, grad = _estimate_and_grad("k3_unbiased")
    d = [r - lp for r, lp in zip(_flat(REF).tolist(), _flat(LOGP).tolist())]  # ref - logp
    ratio = [E(lp - o) for lp, o in zip(_flat(LOGP).tolist(), _flat(OLD).tolist())]
    k3 = [E(x) - x - 1 for x in d]
    torch.testing.assert_close(value, torch.tensor([r * k for r, k in zip(ratio, k3)], dtype=torch.float64))
    # d/dlogp [r * k3] = r * k3 (through r) + r * (1 - exp(d)) (through k3)
    expected = [r * k + r * (1 - E(x)) for r, k, x in zip(ratio, k3, d)]
    torch.testing.assert_close(grad, torch.tensor(expected, dtype=torch.float64))


def test_k3_unbiased_on_policy_has_k3s_value_but_not_its_gradient():
    logp = _flat(LOGP).requires_grad_(True)
    value = kl_estimate(logp, _flat(REF), "k3_unbiased", old_logp=_flat(LOGP))
    value.sum().backward()
    d = _flat(REF) - _flat(LOGP)
    k3 = torch.exp(d) - d - 1
    torch.testing.assert_close(value.detach(), k3)
    # r = 1 in value, but its gradient adds k3 itself: the DeepSeek-V3.2 correction is not a no-op on-policy.
    torch.testing.assert_close(logp.grad, k3 + 1 - torch.exp(d))


@pytest.mark.parametrize(("estimator", "base"), [("k1+", "k1"), ("k2+", "k2"), ("k3+", "k3")])
def test_straight_through_estimators_have_the_value_of_their_base_and_the_gradient_of_k2(estimator, base):
    value, grad = _estimate_and_grad(estimator)
    base_value, _ = _estimate_and_grad(base)
    torch.testing.assert_close(value, base_value, rtol=0, atol=0)
    # k2 = (logp - ref)^2 / 2: gradient logp - ref, whatever the value's estimator.
    torch.testing.assert_close(grad, _flat(LOGP) - _flat(REF))


def test_k1_plus_gradient_differs_from_k1s():
    _, grad_plus = _estimate_and_grad("k1+")
    _, grad_k1 = _estimate_and_grad("k1")
    torch.testing.assert_close(grad_k1, torch.ones(T_TOT, dtype=torch.float64))
    assert not torch.allclose(grad_plus, grad_k1)


@pytest.mark.parametrize("estimator", ["k3_unbiased", "k1+", "k3+"])
def test_kl_coef_adds_the_estimate_through_compute_policy_loss(estimator):
    coef = 0.25
    logp = pad(LOGP).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    common = {"old_logp": pad(OLD), "advantages": torch.tensor(ADV, dtype=torch.float64), "mask": mask}
    loss, metrics = compute_policy_loss(
        "dapo", logp=logp, ref_logp=pad(REF), kl_coef=coef, kl_estimator=estimator, eps=10.0, **common
    )
    loss.backward()
    value, grad = _estimate_and_grad(estimator)
    assert metrics["kl_ref"] == pytest.approx(float(value.sum()) / T_TOT, rel=1e-12)
    ratio = torch.exp(_flat(LOGP) - _flat(OLD))
    adv = torch.tensor([ADV[0]] * 3 + [ADV[1]] * 2, dtype=torch.float64)
    policy = -(ratio * adv).sum() / T_TOT  # dapo unclipped (eps 10): -r * A, token-mean
    assert loss.item() == pytest.approx(float(policy) + coef * float(value.sum()) / T_TOT, rel=1e-12)
    expected = (-ratio * adv + coef * grad) / T_TOT
    got = logp.grad[mask.bool()]
    torch.testing.assert_close(got, expected)
    assert torch.equal(logp.grad[~mask.bool()], torch.zeros(1, dtype=torch.float64))


@pytest.mark.parametrize("estimator", ["k3_unbiased", "k3+"])
def test_micro_batches_sum_to_the_full_batch_gradient(estimator):
    gen = torch.Generator().manual_seed(3)
    n, t = 6, 5
    logp0 = -torch.rand(n, t, generator=gen, dtype=torch.float64) - 0.1
    old = logp0 + 0.1 * torch.randn(n, t, generator=gen, dtype=torch.float64)
    ref = logp0 + 0.2 * torch.randn(n, t, generator=gen, dtype=torch.float64)
    adv = torch.randn(n, generator=gen, dtype=torch.float64)
    mask = torch.rand(n, t, generator=gen) > 0.3
    mask[:, 0] = True
    batch = {"logp": logp0, "old_logp": old, "advantages": adv, "mask": mask}
    options = {
        "kl_coef": 0.3,
        "kl_estimator": estimator,
        "num_seqs": float(n),
        "num_tokens": float(mask.sum()),
    }

    def run(parts):
        grad = torch.zeros_like(logp0)
        total = 0.0
        for rows in parts:
            loss, grad[rows], _ = loss_on_rows("grpo", batch, rows, extra={"ref_logp": ref}, **options)
            total += float(loss)
        return total, grad

    whole, grad_whole = run([torch.arange(n)])
    split, grad_split = run([torch.arange(0, 2), torch.arange(2, 5), torch.arange(5, 6)])
    assert split == pytest.approx(whole, rel=1e-12)
    torch.testing.assert_close(grad_split, grad_whole, rtol=1e-12, atol=1e-15)


def test_refusals_name_the_problem():
    with pytest.raises(ValueError, match="'k3_unbiased' needs old_logp"):
        kl_estimate(_flat(LOGP), _flat(REF), "k3_unbiased")
    with pytest.raises(
        ValueError, match=r"unknown kl_estimator 'k4\+'; expected one of: k1, k2, k3, k3_unbiased"
    ):
        kl_estimate(_flat(LOGP), _flat(REF), "k4+")
    mask = torch.ones(2, 3)
    with pytest.raises(ValueError, match="unknown kl_estimator 'k3_biased'"):
        compute_policy_loss(
            "grpo",
            logp=torch.zeros(2, 3),
            old_logp=torch.zeros(2, 3),
            ref_logp=torch.zeros(2, 3),
            advantages=torch.zeros(2),
            mask=mask,
            kl_coef=0.1,
            kl_estimator="k3_biased",
        )


@pytest.mark.parametrize("estimator", ["k3_unbiased", "k1+", "k2+", "k3+"])
def test_config_accepts_the_new_names(estimator):
    config = load_config(None, ["algorithm.kl_coef=0.01", f"algorithm.kl_estimator={estimator}"])
    assert config.algorithm.kl_estimator == estimator


@pytest.mark.parametrize("overrides", [["algorithm.kl_coef=0.01"], []])
def test_config_refuses_an_unknown_estimator_in_one_line(overrides):
    # Refused even while kl_coef is 0 (the estimator would be silently unused until someone turns the KL on).
    lines = config_error_lines([*overrides, "algorithm.kl_estimator=k5"])
    assert len(lines) == 2, lines
    assert "kl_estimator" in lines[1] and "'k5'" in lines[1] and "k3_unbiased" in lines[1]


def test_config_passes_the_tepo_kl_mask_estimator_to_the_loss():
    from tepo.config.questions import loss_options

    config = load_config("tepo_v2_kl_mask", ["algorithm.tepo_kl_mask_estimator=k3+"])
    assert loss_options(config.algorithm)["tepo_kl_mask_estimator"] == "k3+"
    default = load_config("tepo_v2_kl_mask", [])
    assert default.algorithm.tepo_kl_mask_estimator == "k3"
    assert "tepo_kl_mask_estimator" not in loss_options(default.algorithm)  # the loss's own default: k3


@pytest.mark.parametrize("overrides", [["algorithm.tepo_kl_mask_coef=0.1"], []])
def test_config_refuses_an_unknown_tepo_kl_mask_estimator_in_one_line(overrides):
    lines = config_error_lines([*overrides, "algorithm.tepo_kl_mask_estimator=k5"])
    assert len(lines) == 2, lines
    assert "tepo_kl_mask_estimator" in lines[1] and "'k5'" in lines[1] and "k3+" in lines[1]
