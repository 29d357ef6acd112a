"""The 2026 objectives (docs/algorithms.md "The 2026 objectives") against their closed forms, value AND gradient
w.r.t. logp, written out by hand; the spec's facts (luspo = tepo * T_tot/N, sapo at r = 1 is the plain policy
gradient, tepo_token / gspo_token equal tepo / gspo with a sequence-level advantage); micro-batch invariance.

The sapo, luspo, vespo and tepo_token cases reuse tests/loss_cases.py's hand-checkable batch (N=3, T=3, rows of 3, 2
and 1 tokens, NaN padding, log-ratios d and advantages A in its docstring). The DPPO masks read probabilities,
so they get their own batch of genuine log-probabilities.
"""

from __future__ import annotations

import math

import pytest
import torch

from loss_cases import (
    ADV,
    LENS,
    LOGP,
    T_TOT,
    D,
    E,
    N,
    assert_grad,
    batch,
    loss_on_rows,
    random_mini_batch,
    run,
    seq_mean_token_mean,
    token_mean,
)
from tepo.losses import POLICY_LOSSES, compute_policy_loss

NEW_LOSSES = ["sapo", "luspo", "dppo_tv", "dppo_kl", "vespo", "tepo_token", "gspo_token"]
R = [[E(d) for d in row] for row in D]


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def test_registry_rows_match_the_spec_table():
    expected = {
        "sapo": ("seq-mean-token-mean", {"tau_pos": 1.0, "tau_neg": 1.05}),
        "luspo": ("seq-mean-token-sum", {"eps_low": 0.2, "eps_high": 0.2}),
        "dppo_tv": ("token-mean", {"delta_low": 0.15, "delta_high": 0.15}),
        "dppo_kl": ("token-mean", {"delta": 0.05}),
        "vespo": ("token-mean", {"k_pos": 2.0, "lam_pos": 3.0, "k_neg": 3.0, "lam_neg": 2.0}),
        "tepo_token": ("token-mean", {"eps_low": 0.2, "eps_high": 0.2}),
        "gspo_token": ("seq-mean-token-mean", {"eps_low": 3e-4, "eps_high": 4e-4}),
    }
    for name, (agg, defaults) in expected.items():
        spec = POLICY_LOSSES[name]
        assert (spec.default_agg, dict(spec.defaults)) == (agg, defaults), name
        assert spec.paper and spec.fn.__doc__ and not spec.needs_batch_stats, name


# ---- sapo -------------------------------------------------------------------------------------------------------


def test_sapo_soft_gate_value_and_gradient():
    # tau = 1.0 where A > 0 (rows 0, 2), tau_neg = 1.05 where A < 0 (row 1).
    tau = [1.0, 1.05, 1.0]
    terms = [
        [-(4 / tau[i]) * sigmoid(tau[i] * (R[i][t] - 1)) * ADV[i] for t in range(LENS[i])] for i in range(N)
    ]
    # d/dlogp of -(4/tau) sigmoid(tau (r - 1)) A = -A * r * 4 sigmoid(x) (1 - sigmoid(x)), x = tau (r - 1).
    grads = [
        [
            -ADV[i] * R[i][t] * 4 * sigmoid(tau[i] * (R[i][t] - 1)) * (1 - sigmoid(tau[i] * (R[i][t] - 1)))
            for t in range(LENS[i])
        ]
        for i in range(N)
    ]
    value, grad, metrics = run("sapo")
    assert value == pytest.approx(seq_mean_token_mean(terms), rel=1e-12)
    assert_grad(grad, [[g / (N * LENS[i]) for g in row] for i, row in enumerate(grads)])
    assert metrics["clip_frac_high"] == metrics["clip_frac_low"] == 0.0
    gates = [
        4 * sigmoid(tau[i] * (R[i][t] - 1)) * (1 - sigmoid(tau[i] * (R[i][t] - 1)))
        for i in range(N)
        for t in range(LENS[i])
    ]
    assert metrics["sapo_gate_mean"] == pytest.approx(sum(gates) / 6, rel=1e-12)


def test_sapo_temperatures_are_options():
    value, _, _ = run("sapo", tau_pos=2.0, tau_neg=3.0)
    tau = [2.0, 3.0, 2.0]
    terms = [
        [-(4 / tau[i]) * sigmoid(tau[i] * (R[i][t] - 1)) * ADV[i] for t in range(LENS[i])] for i in range(N)
    ]
    assert value == pytest.approx(seq_mean_token_mean(terms), rel=1e-12)


def test_sapo_gradient_at_ratio_one_is_the_plain_policy_gradient():
    inputs = batch()
    on_policy = {**inputs, "old_logp": inputs["logp"].detach().clone()}
    grads = {}
    for name in (
        "sapo",
        "grpo",
    ):  # grpo is unclipped at r = 1: its gradient is -A * grad(logp), seq-mean-token-mean
        logp = inputs["logp"].detach().clone().requires_grad_(True)
        loss, _ = compute_policy_loss(name, **{**on_policy, "logp": logp})
        loss.backward()
        grads[name] = logp.grad
    torch.testing.assert_close(grads["sapo"], grads["grpo"], rtol=1e-12, atol=1e-14)
    assert_grad(grads["sapo"], [[-ADV[i] / (N * LENS[i])] * LENS[i] for i in range(N)])


# ---- luspo ------------------------------------------------------------------------------------------------------

S = [E(sum(row) / len(row)) for row in D]  # 1.034, 0.882, 1.649


def test_luspo_length_scaled_sequence_term():
    # s_0, s_1 inside [0.8, 1.2]; s_2 = 1.649 with A > 0 clipped at 1.2 (zero gradient).
    seq_terms = [-S[0] * ADV[0], -S[1] * ADV[1], -1.2 * ADV[2]]
    value, grad, metrics = run("luspo")
    assert value == pytest.approx(sum(LENS[i] * seq_terms[i] for i in range(N)) / N, rel=1e-12)
    # d/dlogp[i,t] of (1/N) |o_i| * (-s_i A_i) = -s_i A_i / N on each token of an unclipped row.
    assert_grad(grad, [[-S[0] * ADV[0] / N] * 3, [-S[1] * ADV[1] / N] * 2, [0.0]])
    assert metrics["seq_clip_frac_high"] == pytest.approx(1 / 3)


def test_luspo_is_tepo_times_total_tokens_over_sequences():
    mb = random_mini_batch(16, seed=11)
    n, tokens = mb["mask"].shape[0], int(mb["mask"].sum())
    luspo_loss, luspo_grad, _ = loss_on_rows("luspo", mb, slice(0, n))
    tepo_loss, tepo_grad, _ = loss_on_rows("tepo", mb, slice(0, n), eps=0.2)
    torch.testing.assert_close(luspo_loss, tepo_loss * tokens / n, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(luspo_grad, tepo_grad * tokens / n, rtol=1e-12, atol=1e-14)
    assert luspo_grad.abs().sum() > 0


# ---- dppo_tv / dppo_kl ------------------------------------------------------------------------------------------

LN = math.log


def _dppo_batch(p, q, d_old, adv):
    """Rows of valid tokens: p = exp(logp), q = exp(rollout_logp), old = logp - d_old (so r = exp(d_old))."""
    logp = torch.tensor([[LN(x) for x in row] for row in p], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[LN(x) - d for x, d in zip(pr, dr)] for pr, dr in zip(p, d_old)], dtype=torch.float64)
    rollout = torch.tensor([[LN(x) for x in row] for row in q], dtype=torch.float64)
    mask = torch.ones(len(p), len(p[0]), dtype=torch.bool)
    return {
        "logp": logp,
        "old_logp": old,
        "advantages": torch.tensor(adv, dtype=torch.float64),
        "mask": mask,
    }, rollout


DPPO_D = [[0.1, -0.2], [0.3, -0.1]]
DPPO_R = [[E(d) for d in row] for row in DPPO_D]
DPPO_A = [1.0, -1.0]


def _assert_dppo_masked(loss, grad, metrics, keep):
    """The DPPO loss on the 2 x 2 batch keeping the tokens where ``keep`` is 1: value -sum(M r A) / 4, and since
    d(-M r A)/dlogp = -M r A, the gradient of r where kept and 0 where masked; a quarter masked on each side."""
    expected = sum(-keep[i][t] * DPPO_R[i][t] * DPPO_A[i] for i in range(2) for t in range(2)) / 4
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    expected_grad = [[-keep[i][t] * DPPO_R[i][t] * DPPO_A[i] / 4 for t in range(2)] for i in range(2)]
    torch.testing.assert_close(grad, torch.tensor(expected_grad, dtype=torch.float64))
    assert metrics["clip_frac_high"] == metrics["clip_frac_low"] == pytest.approx(1 / 4)


def test_dppo_tv_masks_where_the_probability_moved_past_delta_in_the_advantages_direction():
    # Row 0 (A>0): p - q = 0.2 > 0.15 masked, -0.05 kept. Row 1 (A<0): p - q = -0.2 < -0.15 masked, 0.05 kept.
    p, q = [[0.5, 0.3], [0.2, 0.5]], [[0.3, 0.35], [0.4, 0.45]]
    inputs, rollout = _dppo_batch(p, q, DPPO_D, DPPO_A)
    loss, metrics = compute_policy_loss("dppo_tv", **inputs, rollout_logp=rollout)
    loss.backward()
    _assert_dppo_masked(loss, inputs["logp"].grad, metrics, keep=[[0.0, 1.0], [0.0, 1.0]])


def test_dppo_tv_behaviour_is_old_logp_without_rollout_logp():
    # Without rollout_logp, q = exp(old) = p * exp(-d): row 0 t0 p - q = 0.5 (1 - e^-0.1) = 0.048 < 0.15: kept.
    p = [[0.5, 0.3], [0.2, 0.5]]
    inputs, _ = _dppo_batch(p, p, DPPO_D, DPPO_A)
    loss, metrics = compute_policy_loss("dppo_tv", **inputs)
    expected = sum(-DPPO_R[i][t] * DPPO_A[i] for i in range(2) for t in range(2)) / 4
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert metrics["clip_frac_high"] == metrics["clip_frac_low"] == 0.0
    # delta_low 0.0: row 1 t1 p - q = 0.5 (1 - e^0.1) < 0 with A < 0 is now masked.
    loss, metrics = compute_policy_loss("dppo_tv", **inputs, delta_low=0.0)
    assert loss.item() == pytest.approx(expected + DPPO_R[1][1] * DPPO_A[1] / 4, rel=1e-12)
    assert metrics["clip_frac_low"] == pytest.approx(1 / 4)


def _binary_kl(q, p):
    return q * (LN(q) - LN(p)) + (1 - q) * LN((1 - q + 1e-8) / (1 - p + 1e-8))


def test_dppo_kl_masks_by_binary_kl_in_the_advantages_direction():
    # Row 0 (A>0): (p, q) = (0.6, 0.3): D = 0.184 > 0.05 and p > q: masked; (0.35, 0.3): D = 0.006: kept.
    # Row 1 (A<0): (0.1, 0.4): D = 0.311, p < q: masked; (0.6, 0.3): D = 0.184 but p > q: kept.
    p, q = [[0.6, 0.35], [0.1, 0.6]], [[0.3, 0.3], [0.4, 0.3]]
    assert _binary_kl(0.3, 0.6) > 0.05 > _binary_kl(0.3, 0.35) and _binary_kl(0.4, 0.1) > 0.05
    inputs, rollout = _dppo_batch(p, q, DPPO_D, DPPO_A)
    loss, metrics = compute_policy_loss("dppo_kl", **inputs, rollout_logp=rollout)
    loss.backward()
    _assert_dppo_masked(loss, inputs["logp"].grad, metrics, keep=[[0.0, 1.0], [0.0, 1.0]])
    # delta above every D keeps all tokens.
    loss, metrics = compute_policy_loss("dppo_kl", **inputs, rollout_logp=rollout, delta=0.4)
    assert loss.item() == pytest.approx(
        sum(-DPPO_R[i][t] * DPPO_A[i] for i in range(2) for t in range(2)) / 4
    )


def test_dppo_kl_is_finite_where_a_probability_is_one():
    inputs, rollout = _dppo_batch([[1.0, 0.5]], [[0.5, 1.0]], [[0.0, 0.0]], [1.0])
    loss, _ = compute_policy_loss("dppo_kl", **inputs, rollout_logp=rollout)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(inputs["logp"].grad).all()


# ---- vespo ------------------------------------------------------------------------------------------------------


def _phi(log_w, k, lam):
    return math.exp(k * log_w + lam * (1 - math.exp(log_w)))


def test_vespo_detached_gamma_weight_of_the_product_ratio():
    # log W_i = sum_t d: 0.1, -0.25, 0.5. (k, lam) = (2, 3) for A_i >= 0 (rows 0, 2), (3, 2) for row 1.
    phi = [_phi(0.1, 2, 3), _phi(-0.25, 3, 2), _phi(0.5, 2, 3)]
    terms = [[-phi[i] * ADV[i] * LOGP[i][t] for t in range(LENS[i])] for i in range(N)]
    value, grad, metrics = run("vespo")
    assert value == pytest.approx(token_mean(terms), rel=1e-12)
    assert_grad(grad, [[-phi[i] * ADV[i] / T_TOT] * LENS[i] for i in range(N)])
    assert metrics["vespo_phi_mean"] == pytest.approx(sum(phi) / 3, rel=1e-12)
    assert _phi(0.0, 2, 3) == 1.0  # phi(1) = 1


def test_vespo_clamps_the_summed_log_ratio():
    logp = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-13.0, -13.0], [14.0, 14.0]], dtype=torch.float64)  # sums +24 and -30
    loss, _ = compute_policy_loss(
        "vespo", logp=logp, old_logp=old, advantages=torch.tensor([1.0, 1.0]), mask=torch.ones(2, 2)
    )
    loss.backward()
    phi_low = _phi(math.log(1e-8), 2, 3)  # log W clamped up to ln 1e-8: 1e-16 * e^3
    # Row 0: log W clamped at 20, phi = exp(40 + 3 (1 - e^20)) = 0 in float64.
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 0.0], [-phi_low / 4] * 2], dtype=torch.float64))
    assert loss.item() == pytest.approx(-phi_low * 1.0 * -2.0 / 4, rel=1e-12)


# ---- tepo_token / gspo_token ------------------------------------------------------------------------------------


def test_tepo_token_with_token_level_advantages():
    # eps 10: nothing clipped. Value -sum_t s_i A[i,t] / T_tot; gradient -s_i A[i,t] / T_tot per token, where tepo
    # gives every token of row i the row's mean advantage.
    inputs = batch()
    adv = torch.tensor([[1.0, -1.0, 3.0], [0.5, -2.0, 0.0], [2.0, 0.0, 0.0]], dtype=torch.float64)
    loss, _ = compute_policy_loss("tepo_token", **{**inputs, "advantages": adv}, eps=10.0)
    loss.backward()
    a = adv.tolist()
    expected = -sum(S[i] * a[i][t] for i in range(N) for t in range(LENS[i])) / T_TOT
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert_grad(inputs["logp"].grad, [[-S[i] * a[i][t] / T_TOT for t in range(LENS[i])] for i in range(N)])
    tepo_inputs = batch()
    compute_policy_loss("tepo", **{**tepo_inputs, "advantages": adv}, eps=10.0)[0].backward()
    assert not torch.allclose(tepo_inputs["logp"].grad, inputs["logp"].grad)


def test_tepo_token_clips_per_token_on_the_sequence_ratio():
    # Row 2: s = 1.649 > 1.2. Its token with A > 0 is clipped (zero gradient); with A < 0 it is not.
    logp = torch.tensor([[0.2, -1.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-0.3, -1.5]], dtype=torch.float64)  # d = 0.5, 0.5: s = e^0.5
    adv = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    loss, metrics = compute_policy_loss(
        "tepo_token", logp=logp, old_logp=old, advantages=adv, mask=torch.ones(1, 2)
    )
    loss.backward()
    s = E(0.5)
    assert loss.item() == pytest.approx((-1.2 * 1.0 + s * 1.0) / 2, rel=1e-12)
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, s / 2]], dtype=torch.float64))
    assert metrics["clip_frac_high"] == pytest.approx(1 / 2) and metrics["seq_ratio_max"] == pytest.approx(s)


@pytest.mark.parametrize(("token_loss", "loss", "options"), [
    ("tepo_token", "tepo", {}),
    ("gspo_token", "gspo", {}),
    ("gspo_token", "gspo", {"eps": 0.2}),
    ("tepo_token", "tepo", {"eps": 0.05}),
])  # fmt: skip
def test_token_forms_equal_the_sequence_forms_with_a_sequence_level_advantage(token_loss, loss, options):
    mb = random_mini_batch(24, seed=5)
    n = mb["mask"].shape[0]
    a_loss, a_grad, _ = loss_on_rows(token_loss, mb, slice(0, n), **options)
    b_loss, b_grad, _ = loss_on_rows(loss, mb, slice(0, n), **options)
    torch.testing.assert_close(a_loss, b_loss, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(a_grad, b_grad, rtol=1e-12, atol=1e-14)


# ---- micro-batch invariance -------------------------------------------------------------------------------------


def _behaviour(mb, seed=0):
    """A sampler's log-probs near the old policy's (genuine log-probs: <= 0)."""
    gen = torch.Generator().manual_seed(seed)
    noise = 0.1 * torch.randn(mb["old_logp"].shape, generator=gen, dtype=torch.float64)
    return (mb["old_logp"] + noise).clamp(max=-1e-3)


@pytest.mark.parametrize("name", NEW_LOSSES)
def test_micro_batches_give_the_one_call_gradient(name):
    mb = random_mini_batch(32, seed=3)
    n = mb["mask"].shape[0]
    counts = {"num_tokens": int(mb["mask"].sum()), "num_seqs": n}
    # Probabilities for the DPPO masks: log-probs must be <= 0 (the mini-batch's old_logp is; shift logp too).
    mb = {**mb, "logp": mb["logp"].clamp(max=-1e-3)}
    extra = {"rollout_logp": _behaviour(mb)}
    full_loss, full_grad, _ = loss_on_rows(name, mb, slice(0, n), extra=extra, **counts)
    parts = [loss_on_rows(name, mb, slice(s, s + 8), extra=extra, **counts) for s in range(0, n, 8)]
    torch.testing.assert_close(sum(p[0] for p in parts), full_loss, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(torch.cat([p[1] for p in parts]), full_grad, rtol=1e-12, atol=1e-14)
    assert full_grad.abs().sum() > 0


# ---- refusals ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "options", "message"), [
    ("sapo", {"tau_pos": 0.0}, "tau_pos must be > 0"),
    ("sapo", {"tau_neg": -1.0}, "tau_neg must be > 0"),
    ("vespo", {"lam_neg": 0.0}, "lam_neg must be > 0"),
    ("vespo", {"k_pos": -1.0}, "k_pos must be >= 0"),
    ("dppo_tv", {"delta_high": -0.1}, "delta_high must be >= 0"),
    ("dppo_kl", {"delta": -0.1}, "delta must be >= 0"),
    ("dppo_kl", {"delta_low": 0.1}, "unknown option"),
    ("luspo", {"eps": -0.1}, "eps_low must be >= 0"),
    ("sapo", {"eps": 0.2}, "unknown option"),
])  # fmt: skip
def test_bad_options_are_refused_with_one_clear_message(name, options, message):
    with pytest.raises(ValueError, match=message):
        compute_policy_loss(name, **batch(), **options)


# ---- verl's gpg and dro (#39) ----------------------------------------------------------------------------------


def test_gpg_and_dro_value_and_gradient_by_hand():
    logp = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.5, -2.0], [-0.5, 0.0]], dtype=torch.float64)
    adv = torch.tensor([2.0, -1.0], dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 0]])
    loss, _ = compute_policy_loss("gpg", logp=logp, old_logp=old, advantages=adv, mask=mask)
    # token-mean over 3 tokens of -A*logp: (2*1 + 2*2 + (-1)*0.5) / 3 = 5.5 / 3; d/dlogp = -A/3.
    assert float(loss.detach()) == pytest.approx(5.5 / 3, abs=1e-15)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-2 / 3, -2 / 3], [1 / 3, 0.0]], dtype=torch.float64))
    logp.grad = None
    loss, metrics = compute_policy_loss("dro", logp=logp, old_logp=old, advantages=adv, mask=mask, beta=0.4)
    # Penalty 0.2*(0.5)^2 = 0.05 on token (0, 0) only: value (5.5 + 0.05) / 3; its gradient adds 0.4*0.5/3.
    assert float(loss.detach()) == pytest.approx(5.55 / 3, abs=1e-15)
    loss.backward()
    torch.testing.assert_close(
        logp.grad, torch.tensor([[-2 / 3 + 0.2 / 3, -2 / 3], [1 / 3, 0.0]], dtype=torch.float64)
    )
    assert metrics["dro_log_ratio_mean"] == pytest.approx(0.5 / 3)
    with pytest.raises(ValueError, match="beta > 0"):
        compute_policy_loss("dro", logp=logp, old_logp=old, advantages=adv, mask=mask, beta=0.0)
