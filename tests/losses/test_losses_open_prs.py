"""The objectives of open TRL / verl pull requests (up, cppo, topr, stare, fipo, dapo_zv): closed forms of value
and gradient on hand-checkable batches, each alternative reading the spec names, and refused options.

The hand batch is tests/loss_cases.py's: rows of 3, 2 and 1 tokens, A = (1, -2, 0.5), d = logp - old as listed
there, so r = e^d and T_tot = 6.
"""

from __future__ import annotations

import math
import typing

import pytest
import torch

from loss_cases import ADV, LOGP, E, assert_grad, batch, run
from tepo.losses import POLICY_LOSSES, compute_policy_loss, register_policy_loss
from tepo.losses.surprisal_weight import _k


def _one_row(old, logp, adv, **options):
    """Loss on one or more full rows given as lists: value, gradient, metrics."""
    lp = torch.tensor(logp, dtype=torch.float64).requires_grad_(True)
    old_t = torch.tensor(old, dtype=torch.float64)
    loss, metrics = compute_policy_loss(
        options.pop("name"),
        logp=lp,
        old_logp=old_t,
        advantages=torch.tensor(adv, dtype=torch.float64),
        mask=torch.ones_like(old_t),
        **options,
    )
    loss.backward()
    return loss.item(), lp.grad, metrics


# ---- option checking: None where the spec allows it -----------------------------------------------------------


def test_a_float_option_annotated_none_accepts_none_and_others_refuse_it(scratch_registry):
    # log_ratio_clamp defaults to 20.0 but may be None (off, TRL's reading); eps_low may not.
    assert POLICY_LOSSES["up"].nullable == {"delta", "dual_clip", "log_ratio_clamp"}
    value = run("up", delta=None, dual_clip=None, log_ratio_clamp=None)[0]
    assert value == pytest.approx(run("up")[0], rel=1e-15)
    with pytest.raises(
        ValueError, match="option eps_low of policy loss 'up' must be a finite number, got None"
    ):
        run("up", eps_low=None)
    with pytest.raises(ValueError, match=r"log_ratio_clamp .* finite number or None \(off\), got 'x'"):
        run("up", log_ratio_clamp="x")

    # The rule is read from the annotation, whatever its spelling.
    @register_policy_loss("optional_typing")
    def optional_typing(inputs, *, cap: typing.Optional[float] = 2.0):  # noqa: UP045
        return -inputs.advantages * inputs.logp, {"cap": 0.0 if cap is None else cap}

    assert POLICY_LOSSES["optional_typing"].nullable == {"cap"}
    assert run("optional_typing", cap=None)[2]["cap"] == 0.0


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("up", {"eps_low": 1.0}, r"eps_low must be in \[0, 1\)"),
        ("up", {"dual_clip": 1.0}, r"dual_clip must be in \(1, inf\)"),
        ("up", {"delta": 0.9}, r"delta must be in \(1, inf\)"),
        ("cppo", {"w_min": 0.0}, r"w_min must be in \(0, 1\]"),
        ("cppo", {"delta_b_q": 1.5}, r"delta_b_q must be in \[0, 1\]"),
        ("cppo", {"tis_cap": 0.0}, r"tis_cap must be in \(0, inf\)"),
        ("cppo", {"value_form": "paper"}, "value_form must be one of ratio, verl"),
        ("cppo", {"horizon": 0}, "horizon must be None"),
        ("topr", {"lower": 0.5, "upper": 0.4}, "lower <= upper"),
        ("topr", {"seq_ratio": "max"}, "seq_ratio must be one of sum, mean"),
        ("stare", {"p": 1.5}, r"p must be in \[0, 1\]"),
        ("stare", {"variant": "C3"}, "variant must be one of O1, C2"),
        ("stare", {"k_rounding": "floor"}, "k_rounding must be one of ceil, authors"),
        ("fipo", {"clip_ratio_c": 1.0}, r"clip_ratio_c must be in \(1, inf\)"),
        ("fipo", {"decay_rate": 0.0}, r"decay_rate must be in \(0, inf\)"),
        ("dapo_zv", {"tol": -1.0}, r"tol must be in \[0, inf\)"),
    ],
)
def test_invalid_options_are_refused(name, options, message):
    with pytest.raises(ValueError, match=message):
        compute_policy_loss(name, **batch(), entropy=torch.zeros(3, 3), **options)


# ---- up ---------------------------------------------------------------------------------------------------------


def test_up_reinforce_on_positive_tokens_clipped_surrogate_on_the_rest():
    value, grad, metrics = run("up")
    # A > 0: value -A, gradient -A. Row 1 (A = -2): r = e^-0.5 < 0.8 gives the constant 2 * 0.8; r = e^0.25
    # gives 2r (the lower clip cannot beat it; eps_high is inert without delta).
    assert value == pytest.approx((-3 + 1.6 + 2 * E(0.25) - 0.5) / 6, rel=1e-12)
    assert_grad(grad, [[-1 / 6] * 3, [0.0, 2 * E(0.25) / 6], [-0.5 / 6]])
    assert metrics["clip_frac_low"] == pytest.approx(1 / 6)
    assert metrics["up_clipfrac"] == pytest.approx(1 / 2)  # of the two A <= 0 tokens
    assert metrics["up_low_mean"] == pytest.approx(1 / 6)
    assert metrics["up_low_min"] == 0.0  # rows 0 and 2 have no such token
    assert metrics["ppo_kl"] == pytest.approx(
        -sum(sum(r) for r in ([0.1, -0.3, 0.3], [-0.5, 0.25], [0.5])) / 6
    )


def test_up_positive_value_is_minus_a_whatever_the_ratio():
    value, grad, _ = _one_row([[-1.0, -1.0]], [[2.0, -5.0]], [0.7], name="up")
    assert value == pytest.approx(-0.7, rel=1e-15)
    torch.testing.assert_close(grad, torch.full((1, 2), -0.35, dtype=torch.float64))


def test_up_verl_dual_clip_three_caps_a_negative_token_past_three():
    old, logp = [[-2.0]], [[-2.0 + math.log(4.0)]]  # r = 4, A = -1
    value, grad, metrics = _one_row(old, logp, [-1.0], name="up")
    assert (value, grad.item()) == (pytest.approx(4.0), pytest.approx(4.0))
    value, grad, metrics = _one_row(old, logp, [-1.0], name="up", dual_clip=3.0)
    assert (value, grad.item(), metrics["up_clipfrac_lower"]) == (pytest.approx(3.0), 0.0, 1.0)


def test_up_delta_binds_below_one_plus_eps_high_and_the_clamp_is_verls():
    # r = e^0.25 = 1.284, A = -2: with delta 1.1 the clipped branch 2 * 1.2 wins, a constant.
    value, grad, _ = _one_row([[-0.7]], [[-0.45]], [-2.0], name="up", delta=1.1)
    assert (value, grad.item()) == (pytest.approx(2.4), 0.0)
    clamped = _one_row([[-30.0]], [[-5.0]], [-1.0], name="up")[0]
    unclamped = _one_row([[-30.0]], [[-5.0]], [-1.0], name="up", log_ratio_clamp=None)[0]
    assert clamped == pytest.approx(E(20.0)) and unclamped == pytest.approx(E(25.0))


# ---- topr -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("seq_ratio", "agg", "rho", "per_row"), [
    ("sum", None, -0.25, [1 / 3, 1 / 3, 1 / 3]),  # the paper's: product ratio, seq-mean-token-sum
    ("mean", "seq-mean-token-mean", -0.125, [1 / 9, 1 / 6, 1 / 3]),  # verl #6986's setting
])  # fmt: skip
def test_topr_tapers_the_negative_sequence_only(seq_ratio, agg, rho, per_row):
    options = {"seq_ratio": seq_ratio, **({"agg": agg} if agg else {})}
    value, grad, metrics = run("topr", **options)
    w = E(rho)  # row 1's sequence ratio, inside [0, 1]
    weights = [1.0, w, 1.0]
    expected = sum(-ADV[i] * weights[i] * sum(LOGP[i]) * per_row[i] for i in range(3))
    assert value == pytest.approx(expected, rel=1e-12)
    assert_grad(grad, [[-ADV[i] * weights[i] * per_row[i]] * len(LOGP[i]) for i in range(3)])
    assert metrics["topr_negative_seq_frac"] == pytest.approx(1 / 3)
    assert metrics["topr_taper_weight_mean"] == pytest.approx((2 + w) / 3)


def test_topr_upper_bound_and_on_policy_reinforce():
    # Row 1 with lower = 0.9: its weight is raised to 0.9.
    assert run("topr", lower=0.9)[2]["topr_taper_weight_mean"] == pytest.approx((2 + 0.9) / 3)
    _, grad, _ = _one_row([[-1.0, -2.0]], [[-1.0, -2.0]], [-1.5], name="topr")
    torch.testing.assert_close(grad, torch.full((1, 2), 1.5, dtype=torch.float64))


# ---- cppo -------------------------------------------------------------------------------------------------------

# One row of three tokens, q = 0.5 each and p = 0.6, 0.8, 0.55: D = (0.1, 0.3, 0.05); w = (1, 0.9, 0.8) (T = 3);
# Z = (0.1, 0.27, 0.04); the 0.9-quantile of D is 0.1 + 0.8 * 0.2 = 0.26, so db = clip(0.26, 0.02, 0.1) = 0.1;
# c = min(0.15, 0.15 + 0.1 * (0, 1, 1.9) - (0, 0.1, 0.37)) = (0.15, 0.15, -0.03): only the first token fits.
CPPO_OLD = [[math.log(0.5)] * 3]
CPPO_LOGP = [[math.log(0.6), math.log(0.8), math.log(0.55)]]


def test_cppo_keeps_the_tokens_within_the_cumulative_budget():
    value, grad, metrics = _one_row(CPPO_OLD, CPPO_LOGP, [1.0], name="cppo")
    assert value == pytest.approx(-1.2 / 3, rel=1e-12)
    torch.testing.assert_close(grad, torch.tensor([[-1.2 / 3, 0.0, 0.0]], dtype=torch.float64))
    assert metrics["cppo_masked_frac"] == pytest.approx(2 / 3)
    # A < 0 with r > 1: A (r - 1) < 0, the update moves pi back toward old, so every token is kept.
    value, grad, metrics = _one_row(CPPO_OLD, CPPO_LOGP, [-1.0], name="cppo")
    assert value == pytest.approx((1.2 + 1.6 + 1.1) / 3, rel=1e-12)
    assert metrics["cppo_masked_frac"] == 0.0


def test_cppo_tis_cap_and_verls_value_form():
    value, grad, metrics = _one_row(CPPO_OLD, CPPO_LOGP, [1.0], name="cppo", tis_cap=1.1)
    assert value == pytest.approx(-1.1 / 3, rel=1e-12)
    assert grad[0, 0].item() == pytest.approx(-1.1 / 3, rel=1e-12)
    assert metrics["cppo_tis_capped_frac"] == pytest.approx(1 / 3)
    value, verl_grad, _ = _one_row(CPPO_OLD, CPPO_LOGP, [1.0], name="cppo", value_form="verl")
    assert value == pytest.approx(-1.2 * math.log(0.6) / 3, rel=1e-12)
    torch.testing.assert_close(verl_grad, torch.tensor([[-1.2 / 3, 0.0, 0.0]], dtype=torch.float64))


def test_cppo_horizon_fixes_the_position_schedule():
    # With horizon 5, w = (1, 0.95, 0.9): Z_2 = 0.285 still exceeds its threshold; the result is the same here,
    # while a horizon of 1 puts every weight at w_min.
    assert _one_row(CPPO_OLD, CPPO_LOGP, [1.0], name="cppo", horizon=5)[0] == pytest.approx(-1.2 / 3)
    on_policy = _one_row(CPPO_OLD, CPPO_OLD, [2.0], name="cppo")
    assert on_policy[0] == pytest.approx(-2.0) and on_policy[2]["cppo_masked_frac"] == 0.0


# ---- stare ------------------------------------------------------------------------------------------------------

# The clipped terms of the hand batch (eps 0.2): row 0 -e^0.1, -e^-0.3, -1.2 (constant); row 1 1.6 (constant),
# 2e^0.25; row 2 -0.6 (constant). The A > 0 tokens are row 0's three and row 2's one: k = ceil(0.4) = 1, the most
# surprising is logp = -2.3 (row 0, token 1).
STARE_TERMS = [[-E(0.1), -E(-0.3), -1.2], [1.6, 2 * E(0.25)], [-0.6]]


def _stare(entropy=0.1, **options):
    inputs = batch()
    loss, metrics = compute_policy_loss("stare", **inputs, entropy=torch.full((3, 3), entropy), **options)
    loss.backward()
    return loss.item(), inputs["logp"].grad, metrics


def test_stare_gate_on_reweights_the_most_surprising_positive_token():
    value, grad, metrics = _stare()
    assert value == pytest.approx((sum(map(sum, STARE_TERMS)) + 0.1 * STARE_TERMS[0][1]) / 6, rel=1e-12)
    assert_grad(grad, [[-E(0.1) / 6, -1.1 * E(-0.3) / 6, 0.0], [0.0, 2 * E(0.25) / 6], [0.0]])
    assert metrics["stare_gate_on"] == 1.0 and metrics["stare_batch_entropy"] == pytest.approx(0.1)
    assert metrics["stare_positive_reweight_ratio"] == pytest.approx(1 / 6)
    assert metrics["stare_mean_weight"] == pytest.approx((5 + 1.1) / 6)


def test_stare_c2_also_damps_the_most_surprising_negative_token_and_the_gate_closes():
    value = _stare(variant="C2")[0]
    extra = 0.1 * STARE_TERMS[0][1] - 0.1 * STARE_TERMS[1][0]  # logp -2.0 is row 1's most surprising
    assert value == pytest.approx((sum(map(sum, STARE_TERMS)) + extra) / 6, rel=1e-12)
    value, _, metrics = _stare(entropy=0.5)
    assert value == pytest.approx(sum(map(sum, STARE_TERMS)) / 6, rel=1e-12)
    assert metrics["stare_gate_on"] == 0.0 and metrics["stare_positive_reweight_ratio"] == pytest.approx(
        1 / 6
    )
    # The authors' batch entropy, given, overrides the tokens' own.
    assert _stare(entropy=0.5, batch_entropy=0.2)[2]["stare_gate_on"] == 1.0


def test_stare_authors_reading_dual_clip_three_and_their_rounding():
    old, logp = [[-2.0]], [[-2.0 + math.log(4.0)]]  # r = 4, A = -1: TRL's surrogate 4, the authors' 3
    kw = {"name": "stare", "entropy": torch.ones(1, 1)}
    assert _one_row(old, logp, [-1.0], **kw)[0] == pytest.approx(4.0)
    assert _one_row(old, logp, [-1.0], **kw, dual_clip=3.0)[0] == pytest.approx(3.0)
    assert _k(100, 0.07, "ceil") == 8 and _k(100, 0.07, "authors") == 7  # IEEE 100 * 0.07 = 7.000000000000001
    assert _k(5, 0.0, "ceil") == 0 and _k(3, 0.01, "authors") == 1 and _k(0, 0.5, "ceil") == 0


def test_stare_selection_ties_go_to_the_lower_flat_index():
    old = [[-1.0, -1.0, -1.0]]
    _, grad, _ = _one_row(old, old, [1.0], name="stare", entropy=torch.zeros(1, 3))
    torch.testing.assert_close(grad, torch.tensor([[-1.1 / 3, -1 / 3, -1 / 3]], dtype=torch.float64))


# ---- fipo -------------------------------------------------------------------------------------------------------


def test_fipo_future_kl_influence_amplifies_the_advantage():
    # lr = (0.1, 0.05), gamma = 2^-1: F = (0.1 + 0.025, 0.05); iw = clip(e^F, 1, 1.2); r inside the clip range.
    old = [[-1.0, -1.0]]
    logp = [[-0.9, -0.95]]
    value, grad, metrics = _one_row(old, logp, [1.0], name="fipo", decay_rate=1.0)
    iw = [E(0.125), E(0.05)]
    r = [E(0.1), E(0.05)]
    assert value == pytest.approx(-(iw[0] * r[0] + iw[1] * r[1]) / 2, rel=1e-12)
    torch.testing.assert_close(
        grad, torch.tensor([[-iw[0] * r[0] / 2, -iw[1] * r[1] / 2]], dtype=torch.float64)
    )
    assert metrics["fipo_influence_weights_mean_raw"] == pytest.approx((iw[0] + iw[1]) / 2)
    assert metrics["fipo_influence_weight_clip_ratio_upper"] == 0.0
    # Symmetric clip: the same here (both weights inside [0.8, 1.2]); c = 0: only capped at 10.
    assert _one_row(old, logp, [1.0], name="fipo", decay_rate=1.0, high_only=False)[0] == pytest.approx(value)


def test_fipo_safety_clamp_and_on_policy_ppo():
    # A < 0 and r above the safety threshold: iw clamped into [0.8, 1], here 1.
    old, logp = [[-1.0, -1.0]], [[-0.9, -0.95]]
    value = _one_row(old, logp, [-1.0], name="fipo", decay_rate=1.0, safety_threshold=1.05)[0]
    assert value == pytest.approx((E(0.1) + E(0.05)) / 2, rel=1e-12)
    value, _, metrics = _one_row(old, old, [-0.5], name="fipo")
    assert value == pytest.approx(0.5) and metrics["fipo_influence_weight_clip_ratio_lower"] == 1.0


def test_fipo_drops_a_row_with_two_tokens_past_the_dual_clip_from_value_gradient_and_count():
    old = [[-5.0, -5.0], [-1.0, -1.0]]
    logp = [[-2.0, -2.0], [-1.0, -1.0]]  # row 0: r = e^3 > C = 10 twice with A < 0
    lp = torch.tensor(logp, dtype=torch.float64).requires_grad_(True)
    mask = torch.tensor([[1, 1], [1, 0]])
    loss, metrics = compute_policy_loss(
        "fipo", logp=lp, old_logp=torch.tensor(old), advantages=torch.tensor([-1.0, 1.0]), mask=mask
    )
    loss.backward()
    assert loss.item() == pytest.approx(-1.0)  # row 1's one token over the one kept token
    torch.testing.assert_close(lp.grad, torch.tensor([[0.0, 0.0], [-1.0, 0.0]], dtype=torch.float64))
    assert metrics["fipo_sequence_drop_ratio"] == 0.5


# ---- dapo_zv ----------------------------------------------------------------------------------------------------


def test_dapo_zv_leaves_zero_variance_rows_out_of_the_count():
    old = [[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]]
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]])
    results = {}
    for name in ("dapo_zv", "dapo"):
        lp = torch.tensor(old, dtype=torch.float64).requires_grad_(True)
        adv = torch.tensor([1.0, 0.0, -1.0])
        loss, _ = compute_policy_loss(name, logp=lp, old_logp=torch.tensor(old), advantages=adv, mask=mask)
        loss.backward()
        results[name] = (loss.item(), lp.grad)
    assert results["dapo_zv"][0] == pytest.approx(-2 / 4) and results["dapo"][0] == pytest.approx(-2 / 6)
    expected = torch.tensor([[-1 / 4] * 3, [0.0, 0.0, 0.0], [1 / 4, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(results["dapo_zv"][1], expected)


def test_dapo_zv_without_zero_variance_rows_is_dapo():
    assert run("dapo_zv")[0] == pytest.approx(run("dapo")[0], rel=1e-14)
