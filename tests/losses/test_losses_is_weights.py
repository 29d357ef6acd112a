"""``is_weights``: rollout-correction weights multiplied into every loss's per-token term, and nothing else.

Checked: no weights computes exactly what it computed before (value and gradient, bit for bit); weights enter
as constants (closed-form gradients for a token-ratio, a sequence-ratio and a REINFORCE-style loss); the
regularizers are not weighted (verl's reading); and micro-batches with weights still sum to the mini-batch
gradient for every registered loss.
"""

from __future__ import annotations

import math

import pytest
import torch

from loss_cases import random_loss_inputs, stats_of
from tepo.losses import POLICY_LOSSES, compute_policy_loss, get_policy_loss

NAN = float("nan")
# Two rows, T = 3; row 1 has two valid tokens (its last position holds NaN padding).
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.7, NAN]], dtype=torch.float64)
D = torch.tensor([[0.1, -0.1, 0.3], [0.05, -0.15, NAN]], dtype=torch.float64)  # logp - old
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
ADV = torch.tensor([1.0, -2.0], dtype=torch.float64)
W = torch.tensor([[0.5, 2.0, 1.5], [0.25, 1.0, NAN]], dtype=torch.float64)  # NaN at padding must not matter
T_TOT = 5


def _call(name, weights=None, **options):
    logp = (OLD + D).clone().requires_grad_(True)
    extra = {} if weights is None else {"is_weights": weights}
    loss, metrics = compute_policy_loss(
        name, logp=logp, old_logp=OLD, advantages=ADV, mask=MASK, **extra, **options
    )
    loss.backward()
    return loss.detach(), logp.grad, metrics


def _full_inputs(seed=0, n=6, width=5):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (n,), generator=gen)
    lengths[2] = 0
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).long()
    inputs = random_loss_inputs(gen, mask)
    return {**inputs, "is_weights": torch.rand(n, width, generator=gen, dtype=torch.float64) * 2}


@pytest.mark.parametrize("name", list(POLICY_LOSSES))
def test_no_weights_is_bit_identical_and_unit_weights_change_nothing(name):
    batch = _full_inputs(1)
    weights = batch.pop("is_weights")
    options = {"seed": 0} if name == "clip_cov" else {}
    results = []
    for extra in ({}, {"is_weights": None}, {"is_weights": torch.ones_like(weights)}):
        logp = batch["logp"].clone().requires_grad_(True)
        parts = {k: v for k, v in batch.items() if k != "logp"}
        loss, metrics = compute_policy_loss(name, logp=logp, **parts, **extra, **options)
        loss.backward()
        results.append((loss.detach(), logp.grad, metrics))
    for loss, grad, metrics in results[1:]:
        assert torch.equal(loss, results[0][0])
        assert torch.equal(grad, results[0][1])
        assert metrics == results[0][2]


def test_token_ratio_loss_closed_form_value_and_gradient():
    # grpo with token-mean: l = w * max(-A r, -A clip(r, 0.8, 1.2)); every |d| here keeps r inside [0.8, 1.2]
    # except d = 0.3 (row 0, A > 0: clipped, zero gradient).
    value, grad, _ = _call("grpo", W, agg="token-mean")
    expected_value, expected_grad = 0.0, torch.zeros(2, 3, dtype=torch.float64)
    for i, length in enumerate((3, 2)):
        for t in range(length):
            r, a, w = math.exp(D[i, t]), float(ADV[i]), float(W[i, t])
            clipped = a > 0 and r > 1.2
            expected_value += w * (-a * (1.2 if clipped else r)) / T_TOT
            expected_grad[i, t] = 0.0 if clipped else -w * a * r / T_TOT
    assert value.item() == pytest.approx(expected_value, rel=1e-12)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-12, atol=1e-15)


def test_sequence_ratio_loss_closed_form_gradient():
    # tepo (token-mean): l[i,t] = -A_i s_i (unclipped: s_0 = exp(0.1), s_1 = exp(-0.05) are inside 1 +- 0.2).
    # Weighted: L = sum_i (-A_i s_i) (sum_t w[i,t]) / T_tot, so dL/dlogp[i,t] = -A_i s_i / |o_i| * sum_t w / T_tot.
    value, grad, _ = _call("tepo", W)
    expected_grad = torch.zeros(2, 3, dtype=torch.float64)
    expected_value = 0.0
    for i, length in enumerate((3, 2)):
        s = math.exp(float(D[i, :length].mean()))
        w_sum = float(W[i, :length].sum())
        expected_value += -float(ADV[i]) * s * w_sum / T_TOT
        expected_grad[i, :length] = -float(ADV[i]) * s / length * w_sum / T_TOT
    assert value.item() == pytest.approx(expected_value, rel=1e-12)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-12, atol=1e-15)


def test_cispo_closed_form_gradient():
    # cispo: l = -w * sg[clip(r, 0, 1.28)] * A * logp, so dL/dlogp = -w * min(r, 1.28) * A / T_tot.
    _, grad, _ = _call("cispo", W)
    expected = torch.zeros(2, 3, dtype=torch.float64)
    for i, length in enumerate((3, 2)):
        for t in range(length):
            expected[i, t] = -float(W[i, t]) * min(math.exp(float(D[i, t])), 1.28) * float(ADV[i]) / T_TOT
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-15)


def test_weights_are_constants_even_when_they_require_grad():
    weights = W.clone().requires_grad_(True)
    value, grad, _ = _call("grpo", weights, agg="token-mean")
    reference_value, reference_grad, _ = _call("grpo", W, agg="token-mean")
    assert torch.equal(value, reference_value) and torch.equal(grad, reference_grad)
    assert weights.grad is None


def test_regularizers_are_not_weighted():
    batch = _full_inputs(2)
    weights = batch.pop("is_weights")
    options = {"entropy_coef": 0.1, "kl_coef": 0.2, "tepo_kl_mask_coef": 0.3}
    _, plain = compute_policy_loss("tepo", **batch, **options)
    _, weighted = compute_policy_loss("tepo", **batch, is_weights=weights, **options)
    for key in ("entropy_bonus", "kl_ref", "tepo_kl_mask"):
        assert weighted[key] == plain[key]
    assert weighted["policy_loss"] != plain["policy_loss"]
    # total = weighted policy term + the same regularizers
    regularizers = plain["loss"] - plain["policy_loss"]
    assert weighted["loss"] == pytest.approx(weighted["policy_loss"] + regularizers, rel=1e-12)


@pytest.mark.parametrize("name", list(POLICY_LOSSES))
def test_micro_batches_with_weights_sum_to_the_mini_batch(name):
    batch = _full_inputs(3)
    n, width = batch["mask"].shape
    options = {
        "num_tokens": int(batch["mask"].sum()),
        "num_seqs": n,
        "max_len": width,
        "entropy_coef": 0.01,
        "kl_coef": 0.05,
        "tepo_kl_mask_coef": 0.3,
        **(
            {"seed": 0, "clip_cov_lb": -0.5, "clip_cov_ub": 0.5, "clip_cov_ratio": 0.5}
            if name == "clip_cov"
            else {}
        ),
        **({"kl_cov_ratio": 0.3} if name == "kl_cov" else {}),
    }
    stats = None
    if get_policy_loss(name).needs_batch_stats:
        stats = stats_of(name, batch, *get_policy_loss(name).requires, **options)

    def run(rows):
        logp = batch["logp"][rows].clone().requires_grad_(True)
        parts = {k: v[rows] for k, v in batch.items() if k != "logp"}
        extra = {} if stats is None else {"batch_stats": stats.rows(rows)}
        loss, _ = compute_policy_loss(name, logp=logp, **parts, **extra, **options)
        loss.backward()
        return loss.detach(), logp.grad

    full_loss, full_grad = run(slice(0, n))
    parts = [run(s) for s in (slice(0, 1), slice(1, 4), slice(4, n))]
    torch.testing.assert_close(sum(p[0] for p in parts), full_loss, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(torch.cat([p[1] for p in parts]), full_grad, rtol=1e-12, atol=1e-14)
    assert full_grad.abs().sum() > 0


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        (torch.ones(2, 2), "is_weights must have the shape of logp"),
        (torch.tensor([[1.0, -0.5, 1.0], [1.0, 1.0, 1.0]]), "finite and >= 0"),
        (torch.tensor([[1.0, NAN, 1.0], [1.0, 1.0, 1.0]]), "finite and >= 0"),
        (torch.tensor([[1.0, float("inf"), 1.0], [1.0, 1.0, 1.0]]), "finite and >= 0"),
    ],
)
def test_bad_weights_are_rejected(weights, message):
    with pytest.raises(ValueError, match=message):
        _call("grpo", weights.double())
