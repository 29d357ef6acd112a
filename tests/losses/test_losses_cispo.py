"""``cispo``'s ``cap`` (any ceiling c > 0) and ``cispo_seq`` (CISPO on the sequence ratio), against their closed
forms: value and gradient on hand tensors (issue #36 item 7). Their equality with TRL's own loss is in
tests/integrations/test_integration_trl_config.py (cases ``cispo/cap<1``, ``cispo/sequence``, ``cispo/sequence/cap<1``)."""

from __future__ import annotations

import math

import pytest
import torch

from tepo.losses import compute_policy_loss

F64 = torch.float64
# two rows: lengths 3 and 2, token log-ratios chosen so the ratios straddle the caps used below
LOG_R = torch.tensor(
    [[math.log(0.5), math.log(1.5), math.log(3.0)], [math.log(0.9), math.log(1.1), 0.0]], dtype=F64
)
MASK = torch.tensor([[True, True, True], [True, True, False]])
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.7, 0.0]], dtype=F64)
ADV = torch.tensor([1.0, -2.0], dtype=F64)


def _loss(name, **options):
    logp = (OLD + LOG_R).clone().requires_grad_(True)
    loss, metrics = compute_policy_loss(name, logp=logp, old_logp=OLD, advantages=ADV, mask=MASK, **options)
    loss.backward()
    return loss.detach(), logp.grad, metrics


def _closed_form(weights):
    """token-mean of -w * A * logp over the 5 valid tokens, and its gradient -w * A / 5."""
    logp = OLD + LOG_R
    a = ADV.unsqueeze(-1).expand_as(logp)
    w = torch.tensor(weights, dtype=F64)
    value = (-(w * a * logp))[MASK].sum() / 5
    grad = torch.where(MASK, -w * a / 5, torch.zeros((), dtype=F64))
    return value, grad


@pytest.mark.parametrize(
    ("options", "weights"),
    [
        ({}, [[0.5, 1.28, 1.28], [0.9, 1.1, 0.0]]),  # default ceiling 1 + 0.28
        ({"cap": 0.2}, [[0.2, 0.2, 0.2], [0.2, 0.2, 0.0]]),  # TRL's unset epsilon_high: below 1
        ({"cap": 0.7}, [[0.5, 0.7, 0.7], [0.7, 0.7, 0.0]]),
        ({"cap": 5.0}, [[0.5, 1.5, 3.0], [0.9, 1.1, 0.0]]),  # TRL's recommended value: nothing capped
        ({"cap": 0.7, "eps_low": 0.6}, [[0.5, 0.7, 0.7], [0.7, 0.7, 0.0]]),  # floor 0.4 below r
        ({"cap": 2.0, "eps_low": 0.2}, [[0.8, 1.5, 2.0], [0.9, 1.1, 0.0]]),
    ],
)
def test_cispo_weight_is_the_clipped_token_ratio_under_any_cap(options, weights):
    value, grad, metrics = _loss("cispo", **options)
    want, want_grad = _closed_form(weights)
    torch.testing.assert_close(value, want, rtol=1e-13, atol=0)
    torch.testing.assert_close(grad, want_grad, rtol=1e-13, atol=1e-16)
    ceiling = options.get("cap", 1.28)
    capped = sum(1 for r in (0.5, 1.5, 3.0, 0.9, 1.1) if r > ceiling)
    assert metrics["clip_frac_high"] == pytest.approx(capped / 5)


def test_cispo_seq_weights_every_token_by_the_clipped_sequence_ratio():
    s0 = math.exp((math.log(0.5) + math.log(1.5) + math.log(3.0)) / 3)  # 1.310
    s1 = math.exp((math.log(0.9) + math.log(1.1)) / 2)  # 0.995
    for options, (w0, w1) in [
        ({}, (1.28, s1)),
        ({"cap": 1.0}, (1.0, s1)),
        ({"cap": 0.2}, (0.2, 0.2)),
        ({"cap": 2.0}, (s0, s1)),
        ({"eps_low": 0.001, "cap": 2.0}, (s0, 0.999)),
    ]:
        value, grad, metrics = _loss("cispo_seq", **options)
        want, want_grad = _closed_form([[w0] * 3, [w1, w1, 0.0]])
        torch.testing.assert_close(value, want, rtol=1e-13, atol=0)
        # the weight is detached: the gradient is the REINFORCE one, nothing through s_i
        torch.testing.assert_close(grad, want_grad, rtol=1e-13, atol=1e-16)
    _, _, metrics = _loss("cispo_seq")
    assert metrics["clip_frac_high"] == pytest.approx(3 / 5)  # the 3 tokens of row 0 (s_0 > 1.28)


def test_cispo_seq_equals_cispo_on_one_token_rows():
    logp = torch.tensor([[-0.3], [-1.2], [-2.0]], dtype=F64)
    old = torch.tensor([[-0.1], [-1.9], [-1.0]], dtype=F64)
    adv = torch.tensor([0.5, -1.0, 2.0], dtype=F64)
    mask = torch.ones(3, 1, dtype=torch.bool)
    for cap in (0.3, 1.4):
        seq, _ = compute_policy_loss("cispo_seq", logp=logp, old_logp=old, advantages=adv, mask=mask, cap=cap)
        tok, _ = compute_policy_loss("cispo", logp=logp, old_logp=old, advantages=adv, mask=mask, cap=cap)
        torch.testing.assert_close(seq, tok, rtol=1e-15, atol=0)


@pytest.mark.parametrize("name", ["cispo", "cispo_seq"])
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cap": 0.0}, "cap must be > 0"),
        ({"cap": -1.0}, "cap must be > 0"),
        ({"cap": 2.0, "eps_high": 0.5}, "both set the IS weight's ceiling"),
        ({"cap": 0.5, "eps_low": 0.2}, "above the ceiling"),
        ({"cap": float("nan")}, "finite number"),
    ],
)
def test_bad_caps_are_refused(name, options, message):
    with pytest.raises(ValueError, match=message):
        _loss(name, **options)
