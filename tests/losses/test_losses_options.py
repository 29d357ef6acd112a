"""The 2026 options (docs/algorithms.md "The 2026 objectives", Options): dual_clip, cispo's eps_low,
off_policy_mask, top_entropy_quantile, m2po_threshold. Closed-form value and gradient on small tensors, micro-batch
invariance of the batch-wide selections through mini_batch_stats, and one clear refusal where an option does not
apply or has a bad value."""

from __future__ import annotations

import math

import pytest
import torch

import loss_cases as hand
from loss_cases import E, assert_grad, batch, loss_on_rows, random_mini_batch, run, stats_of, token_mean
from tepo.losses import compute_policy_loss, mini_batch_stats, needs_mini_batch_stats
from tepo.losses.token_selection import MiniBatchStats, m2po_keep

LN = math.log


def _call(name, logp, old, adv, mask=None, **kw):
    logp = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    old = torch.tensor(old, dtype=torch.float64)
    mask = torch.ones(logp.shape) if mask is None else torch.tensor(mask)
    loss, metrics = compute_policy_loss(
        name, logp=logp, old_logp=old, advantages=torch.tensor(adv, dtype=torch.float64), mask=mask, **kw
    )
    loss.backward()
    return loss.item(), logp.grad, metrics


# ---- dual_clip --------------------------------------------------------------------------------------------------

# One row per advantage sign; log-ratios d: r = 4 (above c = 3), 2 (below c), 0.5.
DC_D = [[LN(4.0), LN(2.0), LN(0.5)], [LN(4.0), LN(2.0), LN(0.5)]]
DC_OLD = [[-1.0, -2.0, -0.5], [-1.5, -0.7, -0.3]]
DC_LOGP = [[o + d for o, d in zip(orow, drow)] for orow, drow in zip(DC_OLD, DC_D)]
DC_A = [-1.0, 2.0]


@pytest.mark.parametrize("name", ["grpo", "dapo", "dr_grpo"])
def test_dual_clip_caps_the_negative_advantage_term_at_c_abs_a(name):
    plain, plain_grad, _ = _call(name, DC_LOGP, DC_OLD, DC_A, agg="token-mean", eps=0.2)
    dual, dual_grad, metrics = _call(name, DC_LOGP, DC_OLD, DC_A, agg="token-mean", eps=0.2, dual_clip=3.0)
    # A = -1: terms max(-r A, -clip(r) A) = [4, 2, 0.8]; dual-clip: min(3, .) = [3, 2, 0.8]. A = 2: unchanged
    # [-1.2*2, -1.2*2, -0.5*2].
    a_pos = [-1.2 * 2, -1.2 * 2, -0.5 * 2]
    assert plain == pytest.approx((4 + 2 + 0.8 + sum(a_pos)) / 6, rel=1e-12)
    assert dual == pytest.approx((3 + 2 + 0.8 + sum(a_pos)) / 6, rel=1e-12)
    # Gradient -A r where unclipped: A=-1 row [r=4 -> capped: 0, r=2 -> 2, r=0.5 clipped below (A<0): 0].
    expected = torch.tensor([[0.0, 2.0 / 6, 0.0], [0.0, 0.0, -2 * 0.5 / 6]], dtype=torch.float64)
    torch.testing.assert_close(dual_grad, expected, rtol=1e-12, atol=1e-14)
    assert plain_grad[0, 0].item() == pytest.approx(4.0 / 6)  # without dual-clip the r = 4 token keeps -A r
    assert metrics["clip_frac_dual"] == pytest.approx(1 / 6)


def test_dual_clip_is_off_by_default_and_a_no_op_below_c():
    value, grad, metrics = run("grpo", dual_clip=10.0)  # every ratio of the batch is < 10
    base, base_grad, _ = run("grpo")
    assert value == base and torch.equal(grad, base_grad) and metrics["clip_frac_dual"] == 0.0
    assert "clip_frac_dual" not in run("grpo")[2]


@pytest.mark.parametrize("name", ["tepo", "gspo", "cispo", "sapo", "luspo", "clip_cov"])
def test_dual_clip_is_refused_where_it_does_not_apply(name):
    with pytest.raises(
        ValueError, match="dual_clip applies only to policy losses grpo, dapo, dr_grpo, up, stare;"
    ):
        compute_policy_loss(name, **batch(), dual_clip=3.0)


@pytest.mark.parametrize("value", [1.0, 0.5, float("nan"), "3", True])
def test_dual_clip_bad_values(value):
    with pytest.raises(ValueError, match="dual_clip must be"):
        compute_policy_loss("grpo", **batch(), dual_clip=value)


# ---- cispo eps_low ----------------------------------------------------------------------------------------------


def test_cispo_eps_low_clips_the_weight_from_below_too():
    # test_losses' batch: r = e^d; with eps_low 0.2 the weights below 0.8 (r = e^-0.3 = 0.741, e^-0.5 = 0.607)
    # are raised to 0.8; the upper truncation at 1.28 is unchanged.
    w = [[E(0.1), 0.8, 1.28], [0.8, 1.28], [1.28]]
    terms = [[-w[i][t] * hand.ADV[i] * hand.LOGP[i][t] for t in range(hand.LENS[i])] for i in range(hand.N)]
    value, grad, metrics = run("cispo", eps_low=0.2)
    assert value == pytest.approx(token_mean(terms), rel=1e-12)
    assert_grad(
        grad, [[-w[i][t] * hand.ADV[i] / hand.T_TOT for t in range(hand.LENS[i])] for i in range(hand.N)]
    )
    assert metrics["clip_frac_low"] == pytest.approx(2 / 6)
    assert metrics["clip_frac_high"] == pytest.approx(3 / 6)


def test_cispo_default_stays_upper_only_and_eps_is_refused():
    default, _, metrics = run("cispo")
    explicit_none, _, _ = run("cispo", eps_low=None)
    assert default == explicit_none and metrics["clip_frac_low"] == 0.0
    assert run("cispo", eps_low=0.9)[0] == default  # 1 - 0.9 is below every ratio: the same weights
    with pytest.raises(ValueError, match="unknown option"):
        compute_policy_loss("cispo", **batch(), eps=0.2)
    with pytest.raises(ValueError, match="eps_low must be >= 0"):
        compute_policy_loss("cispo", **batch(), eps_low=-0.1)
    with pytest.raises(ValueError, match="eps_low must be a finite number"):
        compute_policy_loss("cispo", **batch(), eps_low="0.2")


# ---- off_policy_mask --------------------------------------------------------------------------------------------

# Three rows of two tokens, d = logp - old as written; behaviour = rollout_logp.
OPM_OLD = [[-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]]
OPM_LOGP = [[-1.1, -0.9], [-1.2, -1.0], [-1.3, -1.3]]
OPM_A = [-1.0, -1.0, 1.0]


def test_off_policy_mask_drops_negative_advantage_sequences_that_drifted():
    # mean(behaviour - logp) per row with behaviour = old: 0.0, 0.1, 0.3. delta 0.05: row 1 (A<0, 0.1) is dropped;
    # row 0 (drift 0) and row 2 (A>0) are kept. Tokens stay in the count: token-mean over 6.
    r = [[E(-0.1), E(0.1)], [E(-0.2), 1.0], [E(-0.3), E(-0.3)]]
    value, grad, metrics = _call("dapo", OPM_LOGP, OPM_OLD, OPM_A, eps_high=0.2, off_policy_mask=0.05)
    terms = [[-r[0][t] * -1 for t in range(2)], [0.0, 0.0], [-r[2][t] * 1 for t in range(2)]]
    # All ratios are inside [0.8, 1.2] except row 2 (0.741 < 0.8 with A > 0: unclipped anyway).
    assert value == pytest.approx(sum(map(sum, terms)) / 6, rel=1e-12)
    expected = [[r[0][0] / 6, r[0][1] / 6], [0.0, 0.0], [-r[2][0] / 6, -r[2][1] / 6]]
    torch.testing.assert_close(grad, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-14)
    assert metrics["off_policy_mask_frac"] == pytest.approx(1 / 3)


def test_off_policy_mask_reads_rollout_logp_as_behaviour():
    # A sampler 0.5 below the old policy on row 0 makes its drift -0.5: kept; 0.5 above: drift 0.5: dropped.
    for shift, dropped in ((-0.5, 1), (0.5, 2)):
        rollout = torch.tensor(OPM_OLD, dtype=torch.float64)
        rollout[0] += shift
        _, grad, metrics = _call("dapo", OPM_LOGP, OPM_OLD, OPM_A, off_policy_mask=0.05, rollout_logp=rollout)
        assert metrics["off_policy_mask_frac"] == pytest.approx(dropped / 3)
        assert bool((grad[0] == 0).all()) == (dropped == 2)


@pytest.mark.parametrize("name", ["tepo", "sapo", "cispo", "kl_cov"])
def test_off_policy_mask_applies_to_any_loss(name):
    masked = _call(name, OPM_LOGP, OPM_OLD, OPM_A, off_policy_mask=0.05)[1]
    plain = _call(name, OPM_LOGP, OPM_OLD, OPM_A)[1]
    assert bool((masked[1] == 0).all()) and not bool((plain[1] == 0).all())
    torch.testing.assert_close(masked[2], plain[2])


# ---- top_entropy_quantile ---------------------------------------------------------------------------------------


def test_top_entropy_quantile_keeps_tokens_at_or_above_the_quantile():
    inputs = batch()
    entropy = torch.tensor([[0.1, 2.0, 0.5], [1.0, 3.0, float("nan")], [0.2, float("nan"), float("nan")]])
    valid_h = torch.tensor([0.1, 2.0, 0.5, 1.0, 3.0, 0.2], dtype=torch.float64)
    threshold = torch.quantile(valid_h, 1 - 0.5).item()  # linear: between 0.5 and 1.0 -> 0.75
    assert threshold == pytest.approx(0.75)
    loss, metrics = compute_policy_loss("dapo", **inputs, entropy=entropy, top_entropy_quantile=0.5)
    loss.backward()
    # Kept: row0 t1 (2.0), row1 t0 (1.0), row1 t1 (3.0). dapo terms (test_losses): -e^-0.3, 1.6, 2 e^0.25.
    keep = [[0, 1, 0], [1, 1], [0]]
    terms = [[-E(0.1), -E(-0.3), -1.28], [-0.8 * -2, -E(0.25) * -2], [-1.28 * 0.5]]
    grads = [[-E(0.1), -E(-0.3), 0.0], [0.0, 2 * E(0.25)], [0.0]]
    assert loss.item() == pytest.approx(
        token_mean([[k * t for k, t in zip(kr, tr)] for kr, tr in zip(keep, terms)])
    )
    assert_grad(
        inputs["logp"].grad, [[k * g / hand.T_TOT for k, g in zip(kr, gr)] for kr, gr in zip(keep, grads)]
    )
    assert metrics["top_entropy_kept_frac"] == pytest.approx(3 / 6)


def test_top_entropy_quantile_one_keeps_everything_and_needs_entropy():
    entropy = torch.rand(3, 3)
    assert run("tepo", entropy=entropy, top_entropy_quantile=1.0)[0] == run("tepo")[0]
    with pytest.raises(ValueError, match="top_entropy_quantile needs entropy"):
        compute_policy_loss("tepo", **batch(), top_entropy_quantile=0.2)
    for bad in (0.0, 1.5, -0.2):
        with pytest.raises(ValueError, match=r"top_entropy_quantile must be in \(0, 1\]"):
            compute_policy_loss("tepo", **batch(), entropy=entropy, top_entropy_quantile=bad)


# ---- m2po_threshold ---------------------------------------------------------------------------------------------


def test_m2po_drops_the_largest_second_moments_until_the_mean_is_below_tau():
    # m = (logp - behaviour)^2 = d^2: row 0 [0.04, 0.01], row 1 [0.25, 0.0]. tau 0.05: sorted [0.25, 0.04, 0.01,
    # 0]: the mean of all is 0.075 > tau; without 0.25 it is 0.0167 <= tau: only row 1 t0 is dropped.
    old = [[-1.0, -1.0], [-1.0, -1.0]]
    logp = [[-0.8, -1.1], [-1.5, -1.0]]
    value, grad, metrics = _call("dapo", logp, old, [1.0, -1.0], m2po_threshold=0.05, eps=10.0)
    r = [[E(0.2), E(-0.1)], [E(-0.5), 1.0]]
    assert value == pytest.approx((-r[0][0] - r[0][1] + 0.0 + r[1][1]) / 4, rel=1e-12)
    expected = [[-r[0][0] / 4, -r[0][1] / 4], [0.0, r[1][1] / 4]]
    torch.testing.assert_close(grad, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-14)
    assert metrics["m2po_drop_frac"] == pytest.approx(1 / 4)
    # tau 0.01: 0.25 and 0.04 go (mean of [0.01, 0] = 0.005); tau 0: all but the zero one; tau 1: none.
    for tau, kept in ((0.01, 2), (0.0, 1), (1.0, 4)):
        metrics = _call("dapo", logp, old, [1.0, -1.0], m2po_threshold=tau)[2]
        assert metrics["m2po_drop_frac"] == pytest.approx((4 - kept) / 4), tau


def test_m2po_reads_rollout_logp_and_refuses_a_negative_threshold():
    old = torch.zeros(1, 2) - 1.0
    logp = torch.tensor([[-1.0, -1.0]], dtype=torch.float64)
    rollout = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)  # m = [0, 1]
    inputs = {"logp": logp, "old_logp": old, "advantages": torch.tensor([1.0]), "mask": torch.ones(1, 2)}
    assert (
        compute_policy_loss("grpo", **inputs, m2po_threshold=0.1, rollout_logp=rollout)[1]["m2po_drop_frac"]
        == 0.5
    )
    assert compute_policy_loss("grpo", **inputs, m2po_threshold=0.1)[1]["m2po_drop_frac"] == 0.0
    with pytest.raises(ValueError, match="m2po_threshold must be >= 0"):
        compute_policy_loss("grpo", **inputs, m2po_threshold=-0.1)


def test_m2po_ties_are_broken_by_position():
    from tepo.losses.inputs import prepare_inputs

    logp = torch.tensor([[0.0, 0.0, 0.0]], dtype=torch.float64)
    old = torch.tensor([[-1.0, -1.0, 0.0]], dtype=torch.float64)  # m = [1, 1, 0]; tau 0.5 drops one of the 1s
    inputs = prepare_inputs(
        logp=logp, old_logp=old, advantages=torch.tensor([1.0]), mask=torch.ones(1, 3), ref_logp=None,
        entropy=None, old_entropy=None, num_tokens=None, num_seqs=None, max_len=None,
    )  # fmt: skip
    assert m2po_keep(inputs, 0.5).tolist() == [[False, True, True]]


# ---- any option: refusals ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["off_policy_mask", "top_entropy_quantile", "m2po_threshold"])
@pytest.mark.parametrize("value", ["0.1", float("inf"), True])
def test_selection_options_must_be_numbers(key, value):
    with pytest.raises(ValueError, match=f"{key} must be a finite number or None"):
        compute_policy_loss("grpo", **batch(), entropy=torch.rand(3, 3), **{key: value})


# ---- micro-batch invariance -------------------------------------------------------------------------------------


def _mini_batch_with_extras(seed):
    mb = random_mini_batch(48, seed=seed)
    gen = torch.Generator().manual_seed(seed + 100)
    mb["entropy"] = torch.rand(mb["logp"].shape, generator=gen, dtype=torch.float64) * 2
    mb["rollout_logp"] = mb["old_logp"] + 0.2 * torch.randn(
        mb["logp"].shape, generator=gen, dtype=torch.float64
    )
    return mb


def _micro(name, mb, rows, stats, **options):
    extra = {"entropy": mb["entropy"], "rollout_logp": mb["rollout_logp"]}
    batch_stats = None if stats is None else stats.rows(rows)
    return loss_on_rows(name, mb, rows, extra=extra, batch_stats=batch_stats, **options)[:2]


# (loss, the loss's own options, the options under test)
OPTION_CASES = [
    ("grpo", {"eps": 0.05}, {"dual_clip": 1.1}),
    ("cispo", {}, {"eps_low": 0.1}),
    ("tepo", {}, {"off_policy_mask": 0.0}),
    ("tepo", {}, {"top_entropy_quantile": 0.2}),
    ("dapo", {}, {"m2po_threshold": 0.01}),
    ("kl_cov", {"kl_cov_ratio": 0.1}, {"top_entropy_quantile": 0.5, "m2po_threshold": 0.02}),
    ("sapo", {}, {"top_entropy_quantile": 0.3, "off_policy_mask": 0.02}),
]


@pytest.mark.parametrize(("name", "base", "tested"), OPTION_CASES)
def test_micro_batches_with_mini_batch_stats_give_the_one_call_gradient(name, base, tested):
    options = {**base, **tested}
    mb = _mini_batch_with_extras(seed=7)
    n = mb["mask"].shape[0]
    counts = {"num_tokens": int(mb["mask"].sum()), "num_seqs": n}
    full_loss, full_grad = _micro(name, mb, slice(0, n), None, **counts, **options)
    stats = stats_of(name, mb, "entropy", "rollout_logp", **options)
    assert (stats is not None) == needs_mini_batch_stats(name, options)
    parts = [_micro(name, mb, slice(s, s + 8), stats, **counts, **options) for s in range(0, n, 8)]
    torch.testing.assert_close(sum(p[0] for p in parts), full_loss, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(torch.cat([p[1] for p in parts]), full_grad, rtol=1e-12, atol=1e-14)
    plain_stats = stats_of(name, mb, **base)
    plain = _micro(name, mb, slice(0, n), plain_stats, **counts, **base)[1]
    assert full_grad.abs().sum() > 0 and not torch.allclose(full_grad, plain)  # the option changed something
    if any(k in options for k in ("top_entropy_quantile", "m2po_threshold")):
        # Each micro-batch selecting among its own tokens instead gives a different gradient.
        per_call = torch.cat(
            [_micro(name, mb, slice(s, s + 8), None, **counts, **options)[1] for s in range(0, n, 8)]
        )
        assert not torch.allclose(per_call, full_grad)


def test_mini_batch_stats_misuse_is_reported():
    mb = _mini_batch_with_extras(seed=8)
    common = {k: mb[k] for k in ("logp", "old_logp", "advantages", "mask")}
    with pytest.raises(ValueError, match="top_entropy_quantile needs entropy"):
        mini_batch_stats("tepo", **common, top_entropy_quantile=0.2)
    stats = mini_batch_stats("tepo", **common, entropy=mb["entropy"], top_entropy_quantile=0.2)
    assert isinstance(stats, MiniBatchStats) and stats.loss is None
    assert (
        mini_batch_stats("tepo", **common, off_policy_mask=0.1) is None
    )  # a per-row selection: no statistic
    rows = slice(0, 8)
    part = {k: v[rows] for k, v in common.items()}
    with pytest.raises(ValueError, match="pass the same options"):
        compute_policy_loss(
            "tepo",
            **part,
            entropy=mb["entropy"][rows],
            top_entropy_quantile=0.5,
            batch_stats=stats.rows(rows),
        )
    with pytest.raises(ValueError, match="pass the same options"):
        compute_policy_loss("tepo", **part, entropy=mb["entropy"][rows], batch_stats=stats.rows(rows))
    m2 = mini_batch_stats("tepo", **common, m2po_threshold=0.01)
    with pytest.raises(ValueError, match=r"stats.rows\(rows, cols\)"):
        compute_policy_loss("tepo", **part, m2po_threshold=0.01, batch_stats=m2)
    with pytest.raises(ValueError, match="takes no batch_stats"):
        kl = mini_batch_stats("kl_cov", **common, m2po_threshold=0.01)
        compute_policy_loss("tepo", **part, m2po_threshold=0.01, batch_stats=kl.rows(rows))
