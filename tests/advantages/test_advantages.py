"""Advantage estimators and the dynamic-sampling group filter, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from tepo.advantages import (
    ADVANTAGE_ESTIMATORS,
    GroupFilterResult,
    compute_advantages,
    describe,
    describe_table,
    filter_groups,
    list_advantage_estimators,
    register_advantage_estimator,
    select_rows,
)

NAN, INF = float("nan"), float("inf")


def close(actual, expected, tol=1e-5):
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.allclose(actual, expected, atol=tol, rtol=tol), (actual, expected)


# ---------------------------------------------------------------------------------------------------------
# Sequence-level estimators
# ---------------------------------------------------------------------------------------------------------


def test_registry_names_in_registration_order():
    # Like list_policy_losses: registration order (ALGORITHMS.md's), not alphabetical.
    assert list_advantage_estimators() == list(ADVANTAGE_ESTIMATORS)
    assert list_advantage_estimators()[:5] == ["grpo", "dr_grpo", "rloo", "entropy_adv", "erpo"]


def test_grpo_unbiased_std_hand_values():
    # Group 1, R = (1, 0, 0, 0): mean 0.25; squared deviations 0.5625 + 3 * 0.0625 = 0.75;
    # unbiased var 0.75 / 3 = 0.25 -> std 0.5 -> A = 0.75 / 0.5 = 1.5, -0.25 / 0.5 = -0.5.
    # Group 2, R = (2, 4, 6, 4): mean 4; squared deviations 4 + 0 + 4 + 0 = 8; var 8/3; std 1.632993.
    r = torch.tensor([1.0, 0, 0, 0, 2, 4, 6, 4])
    adv = compute_advantages("grpo", r, 4)
    s = math.sqrt(8 / 3)
    close(adv, [0.75 / 0.500001, -0.25 / 0.500001, -0.25 / 0.500001, -0.25 / 0.500001, -2 / s, 0, 2 / s, 0])
    assert adv.dtype == torch.float32


def test_grpo_population_std_option():
    # R = (1, 0, 0, 0): population var 0.75 / 4 = 0.1875, std sqrt(3)/4 -> A = 0.75 / (sqrt(3)/4) = sqrt(3),
    # -0.25 / (sqrt(3)/4) = -1/sqrt(3).
    adv = compute_advantages("grpo", torch.tensor([1.0, 0, 0, 0]), 4, std="population", eps=0.0)
    close(adv, [math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3)])


def test_grpo_eps_is_added_to_std():
    # R = (0, 1): mean 0.5, unbiased std sqrt(0.5) = 0.70710678; with eps = 0.29289322, std + eps = 1 exactly.
    adv = compute_advantages("grpo", torch.tensor([0.0, 1.0]), 2, eps=1 - math.sqrt(0.5))
    close(adv, [-0.5, 0.5])


def test_dr_grpo_hand_values():
    # A = R - mean: (1,0,0,0) -> mean 0.25; (2,4,6,4) -> mean 4.
    adv = compute_advantages("dr_grpo", torch.tensor([1.0, 0, 0, 0, 2, 4, 6, 4]), 4)
    close(adv, [0.75, -0.25, -0.25, -0.25, -2, 0, 2, 0])


def test_rloo_hand_values():
    # A_i = R_i - mean of the others: (1,0,0,0) -> 1 - 0, 0 - 1/3 (x3);
    # (2,4,6) -> 2 - 5, 4 - 4, 6 - 3.
    adv = compute_advantages("rloo", torch.tensor([1.0, 0, 0, 0]), 4)
    close(adv, [1.0, -1 / 3, -1 / 3, -1 / 3])
    adv = compute_advantages("rloo", torch.tensor([2.0, 4, 6]), 3)
    close(adv, [-3.0, 0.0, 3.0])


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_all_equal_groups_give_exact_zero(name):
    # All-equal groups must come out exactly 0 (not a rounding residue divided by std + 1e-6 = 1e-6), including
    # non-representable values such as 0.3.
    r = torch.tensor([0.3, 0.3, 0.3, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.1, 0.7, 0.1])
    adv = compute_advantages(name, r, 3)
    assert torch.equal(adv[:9], torch.zeros(9))
    assert torch.isfinite(adv).all()
    assert adv[9:].abs().sum() > 0


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_group_size_one_gives_zero_not_nan(name):
    adv = compute_advantages(name, torch.tensor([1.0, 0.0, 0.5]), 1)
    assert torch.equal(adv, torch.zeros(3))


def test_float64_rewards_stay_float64_and_int_rewards_accepted():
    adv64 = compute_advantages("dr_grpo", torch.tensor([1.0, 0.0], dtype=torch.float64), 2)
    assert adv64.dtype == torch.float64
    close(adv64, [0.5, -0.5])
    adv_int = compute_advantages("dr_grpo", torch.tensor([1, 0]), 2)
    assert adv_int.dtype == torch.float32
    close(adv_int, [0.5, -0.5])


def test_advantages_carry_no_gradient():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0], requires_grad=True)
    for name in ("grpo", "dr_grpo", "rloo"):
        assert not compute_advantages(name, r, 2).requires_grad
    h = torch.rand(4, 3, requires_grad=True)
    lp = torch.rand(4, 3, requires_grad=True)
    m = torch.ones(4, 3)
    assert not compute_advantages("entropy_adv", r, 2, entropy=h, mask=m).requires_grad
    adv = compute_advantages("erpo", r, 2, entropy=h, mask=m, logp=lp, ref_logp=lp * 0.5)
    assert not adv.requires_grad


# ---------------------------------------------------------------------------------------------------------
# entropy_adv
# ---------------------------------------------------------------------------------------------------------


def test_entropy_adv_hand_values_with_nan_padding():
    # Base grpo on (1, 0, 0, 0): A = (1.5, -0.5, -0.5, -0.5) (up to eps 1e-6).
    # alpha * H with alpha = 4e-4 and H = (0, 1000, 5000) -> (0, 0.4, 2.0).
    # Row 0: cap |1.5| / 2 = 0.75 -> bonus (0, 0.4, 0.75) -> A = (1.5, 1.9, 2.25).
    # Row 1: cap 0.25 -> bonus (0, 0.25, 0.25) -> A = (-0.5, -0.25, -0.25). The bonus is always >= 0.
    # Rows 2, 3: last token is padding holding NaN / inf: output 0 there.
    r = torch.tensor([1.0, 0, 0, 0])
    h = torch.tensor(
        [[0.0, 1000, 5000], [0.0, 1000, 5000], [0.0, 1000, NAN], [10.0, 0.0, INF]], dtype=torch.float32
    )
    m = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 1, 0]])
    adv = compute_advantages("entropy_adv", r, 4, entropy=h, mask=m)
    a1, a0 = 0.75 / 0.500001, -0.25 / 0.500001
    close(
        adv,
        [
            [a1, a1 + 0.4, a1 + a1 / 2],
            [a0, a0 + 0.25, a0 + 0.25],
            [a0, a0 + 0.25, 0.0],
            [a0 + 0.004, a0, 0.0],
        ],
    )
    assert torch.isfinite(adv).all()


def test_entropy_adv_options_and_zero_groups():
    # alpha 0.1, kappa 1, base dr_grpo on (1, 0): A = (0.5, -0.5); H = (2, 20):
    # row 0: min(0.2, 0.5) = 0.2, min(2.0, 0.5) = 0.5 -> (0.7, 1.0); row 1: -> (-0.3, 0.0).
    # Second group all equal: A_i = 0 -> the cap |A_i|/kappa = 0 -> exactly 0 everywhere.
    r = torch.tensor([1.0, 0.0, 1.0, 1.0])
    h = torch.tensor([[2.0, 20.0], [2.0, 20.0], [5.0, 5.0], [5.0, 5.0]])
    adv = compute_advantages(
        "entropy_adv",
        r,
        2,
        entropy=h,
        mask=torch.ones(4, 2, dtype=torch.bool),
        alpha=0.1,
        kappa=1,
        base="dr_grpo",
    )
    close(adv, [[0.7, 1.0], [-0.3, 0.0], [0.0, 0.0], [0.0, 0.0]])


def test_entropy_adv_group_size_one_is_zero():
    adv = compute_advantages(
        "entropy_adv", torch.tensor([1.0, 0.0]), 1, entropy=torch.ones(2, 3), mask=torch.ones(2, 3)
    )
    assert torch.equal(adv, torch.zeros(2, 3))


def test_entropy_adv_base_options_pass_through():
    # grpo with population std on (1, 0, 0, 0): A = (sqrt 3, -1/sqrt 3, ...); H = 0 -> no bonus.
    adv = compute_advantages(
        "entropy_adv",
        torch.tensor([1.0, 0, 0, 0]),
        4,
        entropy=torch.zeros(4, 1),
        mask=torch.ones(4, 1),
        base_options={"std": "population", "eps": 0.0},
    )
    close(adv[:, 0], [math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3)])


# ---------------------------------------------------------------------------------------------------------
# erpo
# ---------------------------------------------------------------------------------------------------------


def _erpo_inputs():
    """One group, G = 2. Row 0 has 4 valid tokens, row 1 has 2 then padding full of NaN / inf.

    Entropy over the 6 valid tokens (1, 3, 1, 3 | 1, 3): mean 2, population std 1 -> z = (-1, 1, -1, 1 | -1, 1).
    K = 2 buckets: row 0 (L=4) p = 0..3 -> b = floor(2p/4) = (0, 0, 1, 1); row 1 (L=2) -> b = (0, 1).
    d = logp - ref = (0.1, 0.3, -0.2, 0.0 | 0.4, -0.3) -> bucket means row 0 (0.2, -0.1), row 1 (0.4, -0.3).
    Bucket 0 across the group: (0.2, 0.4), mean 0.3, std 0.1 -> (-1, +1).
    Bucket 1: (-0.1, -0.3), mean -0.2, std 0.1 -> (+1, -1).
    So Sn = (-1, -1, +1, +1 | +1, -1). Base dr_grpo on R = (1, 0): A = (0.5, -0.5), sgn = (+1, -1).
    """
    r = torch.tensor([1.0, 0.0])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    entropy = torch.tensor([[1.0, 3.0, 1.0, 3.0], [1.0, 3.0, NAN, INF]])
    ref = torch.tensor([[-1.0, -1.0, -1.0, -1.0], [-1.0, -1.0, NAN, -INF]])
    logp = ref + torch.tensor([[0.1, 0.3, -0.2, 0.0], [0.4, -0.3, 0.0, 0.0]])
    logp[1, 2:] = torch.tensor([INF, NAN])
    return r, dict(
        entropy=entropy, mask=mask, logp=logp, ref_logp=ref, num_buckets=2, lam=0.5, eps=0.0, base="dr_grpo"
    )


def test_erpo_relu_gate_hand_values():
    # relu gate at 0: Hn = (0, 1, 0, 1 | 0, 1).
    # row 0: 0.5 + 0.5 * Hn * Sn * (+1) = 0.5 + 0.5 * (0, -1, 0, 1) = (0.5, 0.0, 0.5, 1.0)
    # row 1: -0.5 + 0.5 * (0 * 1, 1 * -1) * (-1) = (-0.5, 0.0); padding -> 0.
    r, kw = _erpo_inputs()
    adv = compute_advantages("erpo", r, 2, **kw)
    close(adv, [[0.5, 0.0, 0.5, 1.0], [-0.5, 0.0, 0.0, 0.0]])
    assert torch.isfinite(adv).all()


def test_erpo_no_gate_hand_values():
    # Hn = z = (-1, 1, -1, 1 | -1, 1).
    # row 0: 0.5 + 0.5 * (1, -1, -1, 1) = (1.0, 0.0, 0.0, 1.0); row 1: -0.5 + 0.5 * (-1, -1) * (-1) = (0.0, 0.0).
    r, kw = _erpo_inputs()
    adv = compute_advantages("erpo", r, 2, gate="none", **kw)
    close(adv, [[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])


def test_erpo_gate_threshold_relu_and_hard():
    # tau = 0.5. relu: Hn = max(z - 0.5, 0) = (0, .5, 0, .5 | 0, .5):
    #   row 0: 0.5 + 0.5 * (0, -.5, 0, .5) = (0.5, 0.25, 0.5, 0.75); row 1: -0.5 + 0.5 * (.5 * -1) * -1 -> (-0.5, -0.25).
    # hard: Hn = 1[z > 0.5] = (0, 1, 0, 1 | 0, 1) -> same as the relu gate at 0.
    r, kw = _erpo_inputs()
    adv = compute_advantages("erpo", r, 2, gate_threshold=0.5, **kw)
    close(adv, [[0.5, 0.25, 0.5, 0.75], [-0.5, -0.25, 0.0, 0.0]])
    adv = compute_advantages("erpo", r, 2, gate="hard", gate_threshold=0.5, **kw)
    close(adv, [[0.5, 0.0, 0.5, 1.0], [-0.5, 0.0, 0.0, 0.0]])


def test_erpo_old_logp_baseline_and_lam_zero():
    r, kw = _erpo_inputs()
    ref = kw.pop("ref_logp")
    # The same numbers supplied as old_logp with progress_baseline="old" give the same answer.
    adv = compute_advantages("erpo", r, 2, old_logp=ref, progress_baseline="old", **kw)
    close(adv, [[0.5, 0.0, 0.5, 1.0], [-0.5, 0.0, 0.0, 0.0]])
    # lam = 0 leaves the base advantage broadcast over valid tokens.
    kw["lam"] = 0.0
    adv = compute_advantages("erpo", r, 2, ref_logp=ref, **kw)
    close(adv, [[0.5, 0.5, 0.5, 0.5], [-0.5, -0.5, 0.0, 0.0]])


def test_erpo_zero_advantage_groups_and_group_size_one_are_zero():
    # All-equal rewards: sgn(A) = 0 and A = 0 -> exact zeros, even with large token signals.
    h = torch.tensor([[1.0, 9.0], [5.0, 0.0]])
    lp = torch.tensor([[-0.1, -5.0], [-2.0, -0.3]])
    m = torch.ones(2, 2)
    adv = compute_advantages("erpo", torch.tensor([1.0, 1.0]), 2, entropy=h, mask=m, logp=lp, ref_logp=lp * 2)
    assert torch.equal(adv, torch.zeros(2, 2))
    adv = compute_advantages("erpo", torch.tensor([1.0, 0.0]), 1, entropy=h, mask=m, logp=lp, ref_logp=lp * 2)
    assert torch.equal(adv, torch.zeros(2, 2))


def test_erpo_left_padding_and_empty_rows():
    # Left padding: positions are counted among valid tokens, so a left-padded row equals its right-padded twin.
    r, kw = _erpo_inputs()
    right = compute_advantages("erpo", r, 2, **kw)
    left_kw = dict(kw)
    for key in ("entropy", "logp", "ref_logp"):
        left_kw[key] = kw[key].clone()
        left_kw[key][1] = torch.roll(kw[key][1], 2)
    left_kw["mask"] = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]], dtype=torch.bool)
    left = compute_advantages("erpo", r, 2, **left_kw)
    close(left[1], torch.roll(right[1], 2))
    close(left[0], right[0])
    # A row with no valid token is all zeros and does not disturb the others (its bucket entries are absent).
    kw["mask"] = torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.bool)
    adv = compute_advantages("erpo", r, 2, **kw)
    assert torch.equal(adv[1], torch.zeros(4))
    # Row 0 alone: entropy z over (1, 3, 1, 3) = (-1, 1, -1, 1), relu -> (0, 1, 0, 1); buckets have a single
    # response -> Sn = 0 -> A = base 0.5 everywhere.
    close(adv[0], [0.5, 0.5, 0.5, 0.5])


# ---------------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------------


def test_unknown_estimator_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'gpro'.*dr_grpo.*grpo.*rloo"):
        compute_advantages("gpro", torch.zeros(4), 2)


def test_unknown_option_lists_valid_options():
    with pytest.raises(
        ValueError, match=r"unknown option\(s\) \['epsilon'\].*'grpo'.*valid options: eps, std"
    ):
        compute_advantages("grpo", torch.zeros(4), 2, epsilon=1e-3)
    with pytest.raises(ValueError, match=r"valid options: \(none\)"):
        compute_advantages("rloo", torch.zeros(4), 2, eps=1e-3)


def test_bad_rewards_and_group_size():
    with pytest.raises(ValueError, match=r"N=5 rows, not a multiple of group_size=2"):
        compute_advantages("grpo", torch.zeros(5), 2)
    with pytest.raises(ValueError, match=r"group_size must be a positive int"):
        compute_advantages("grpo", torch.zeros(4), 0)
    with pytest.raises(ValueError, match=r"rewards must be 1-D"):
        compute_advantages("grpo", torch.zeros(2, 2), 2)
    with pytest.raises(ValueError, match=r"non-finite at rows \[1\]"):
        compute_advantages("grpo", torch.tensor([0.0, NAN]), 2)
    with pytest.raises(ValueError, match=r"empty"):
        compute_advantages("grpo", torch.zeros(0), 2)
    with pytest.raises(ValueError, match=r"std must be 'unbiased' or 'population'"):
        compute_advantages("grpo", torch.zeros(2), 2, std="biased")


def test_token_level_missing_inputs():
    r = torch.tensor([1.0, 0.0])
    with pytest.raises(ValueError, match=r"'entropy_adv' is token-level and needs mask"):
        compute_advantages("entropy_adv", r, 2, entropy=torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"'entropy_adv' needs entropy=\[N, T\]"):
        compute_advantages("entropy_adv", r, 2, mask=torch.ones(2, 3))
    h, m = torch.ones(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match=r"'erpo' needs logp="):
        compute_advantages("erpo", r, 2, entropy=h, mask=m, ref_logp=h)
    with pytest.raises(ValueError, match=r"'erpo' needs ref_logp="):
        compute_advantages("erpo", r, 2, entropy=h, mask=m, logp=h)
    with pytest.raises(ValueError, match=r"'erpo' needs old_logp="):
        compute_advantages("erpo", r, 2, entropy=h, mask=m, logp=h, ref_logp=h, progress_baseline="old")


def test_token_level_bad_shapes_and_values():
    r = torch.tensor([1.0, 0.0])
    with pytest.raises(ValueError, match=r"entropy has shape \(2, 4\), expected the mask's shape \(2, 3\)"):
        compute_advantages("entropy_adv", r, 2, entropy=torch.ones(2, 4), mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"mask must have shape \[N=2, T\]"):
        compute_advantages("entropy_adv", r, 2, entropy=torch.ones(3, 3), mask=torch.ones(3, 3))
    with pytest.raises(ValueError, match=r"only 0/1"):
        compute_advantages("entropy_adv", r, 2, entropy=torch.ones(2, 3), mask=torch.full((2, 3), 0.5))
    h = torch.ones(2, 3)
    h[1, 1] = NAN
    with pytest.raises(
        ValueError, match=r"1 non-finite value\(s\) at valid .* first at \(row, token\) = \(1, 1\)"
    ):
        compute_advantages("entropy_adv", r, 2, entropy=h, mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"kappa must be a number > 0"):
        compute_advantages("entropy_adv", r, 2, entropy=torch.ones(2, 3), mask=torch.ones(2, 3), kappa=0)
    with pytest.raises(ValueError, match=r"base estimator must be sequence-level, 'erpo' is token-level"):
        compute_advantages("entropy_adv", r, 2, entropy=torch.ones(2, 3), mask=torch.ones(2, 3), base="erpo")
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'nope'"):
        compute_advantages("entropy_adv", r, 2, entropy=torch.ones(2, 3), mask=torch.ones(2, 3), base="nope")
    kw = dict(
        entropy=torch.ones(2, 3), mask=torch.ones(2, 3), logp=torch.ones(2, 3), ref_logp=torch.ones(2, 3)
    )
    with pytest.raises(ValueError, match=r"gate must be one of"):
        compute_advantages("erpo", r, 2, gate="soft", **kw)
    with pytest.raises(ValueError, match=r"num_buckets must be a positive int"):
        compute_advantages("erpo", r, 2, num_buckets=0, **kw)


# ---------------------------------------------------------------------------------------------------------
# Registry: user estimators, describe()
# ---------------------------------------------------------------------------------------------------------


def test_user_registered_estimator(scratch_registry):
    @register_advantage_estimator("max_baseline", paper="test")
    def max_baseline(rewards, group_size, *, scale=1.0):
        g = rewards.view(-1, group_size)
        return (scale * (g - g.amax(dim=1, keepdim=True))).flatten()

    # (1, 3) -> max 3 -> (-2, 0), scaled by 2 -> (-4, 0).
    close(compute_advantages("max_baseline", torch.tensor([1.0, 3.0]), 2, scale=2.0), [-4.0, 0.0])
    assert "max_baseline" in list_advantage_estimators()
    with pytest.raises(ValueError, match=r"valid options: scale"):
        compute_advantages("max_baseline", torch.tensor([1.0, 3.0]), 2, scael=2.0)
    with pytest.raises(ValueError, match=r"already registered"):
        register_advantage_estimator("max_baseline")(max_baseline)

    @register_advantage_estimator("bad_shape")
    def bad_shape(rewards, group_size):
        return rewards[:1]

    with pytest.raises(ValueError, match=r"returned shape \(1,\), expected \[N\] with N=2"):
        compute_advantages("bad_shape", torch.tensor([1.0, 3.0]), 2)
    with pytest.raises(TypeError, match=r"exactly two positional parameters"):
        register_advantage_estimator("no_group")(lambda rewards: rewards)


def test_describe_rows_and_table():
    rows = {row["name"]: row for row in describe()}
    assert rows["grpo"] == {
        "name": "grpo",
        "token_level": False,
        "group_relative": True,
        "requires": [],
        "defaults": {"eps": 1e-6, "std": "unbiased"},
        "paper": "DeepSeekMath 2402.03300; TEPO 2510.09369 Eq. 5",
        "summary": "GRPO group-normalised advantage (DeepSeekMath 2402.03300 Sec. 4.1.2; TEPO 2510.09369 Eq. 5).",
    }
    assert rows["erpo"]["requires"] == ["entropy", "logp", "mask", "ref_logp"]
    assert rows["entropy_adv"]["requires"] == ["entropy", "mask"]
    assert rows["entropy_adv"]["token_level"] is True
    assert rows["entropy_adv"]["defaults"]["alpha"] == 4e-4
    assert rows["entropy_adv"]["defaults"]["kappa"] == 2.0
    assert "entropy" not in rows["erpo"]["defaults"]  # inputs are not configuration
    table = describe_table()
    assert table.splitlines()[0].split() == ["name", "level", "needs", "defaults", "paper"]
    assert any(
        line.startswith("erpo") and " token " in line and "entropy,logp,mask,ref_logp" in line
        for line in table.splitlines()
    )
    assert [line.split()[0] for line in table.splitlines()[1:]] == list_advantage_estimators()


# ---------------------------------------------------------------------------------------------------------
# Group filter (dynamic sampling)
# ---------------------------------------------------------------------------------------------------------


def test_filter_groups_mixed():
    # Groups of 2: (1, 1) all correct, (0, 0) all wrong, (1, 0) kept, (0, 1) kept, (0.5, 0.5) all equal (> 0: correct).
    r = torch.tensor([1.0, 1, 0, 0, 1, 0, 0, 1, 0.5, 0.5])
    res = filter_groups(r, 2)
    assert isinstance(res, GroupFilterResult)
    assert res.keep_mask.tolist() == [False, False, False, False, True, True, True, True, False, False]
    assert res.kept_group_indices.tolist() == [2, 3]
    assert res.metrics == {
        "groups_total": 5,
        "groups_kept": 2,
        "groups_dropped_all_correct": 2,
        "groups_dropped_all_wrong": 1,
        "groups_dropped_all_equal": 3,
        "frac_groups_dropped": 0.6,
    }
    assert res.select(torch.arange(10)).tolist() == [4, 5, 6, 7]
    assert res.select(list("abcdefghij")) == ["e", "f", "g", "h"]
    assert res.select(tuple(range(10))) == (4, 5, 6, 7)
    assert res.select(torch.arange(20).view(10, 2)).shape == (4, 2)


def test_filter_groups_with_explicit_correctness():
    # Shaped rewards: group 0 (0.2, 0.2) equal but one correct one not -> dropped, neither all-correct nor all-wrong.
    # Group 1 (1.0, 0.9) both correct but rewards differ -> kept (there is still a reward signal).
    r = torch.tensor([0.2, 0.2, 1.0, 0.9, -1.0, -1.0])
    res = filter_groups(r, 2, correct=[True, False, True, True, False, False])
    assert res.keep_mask.tolist() == [False, False, True, True, False, False]
    assert res.metrics["groups_dropped_all_correct"] == 0
    assert res.metrics["groups_dropped_all_wrong"] == 1
    assert res.metrics["groups_dropped_all_equal"] == 2
    assert res.metrics["groups_kept"] == 1


def test_filter_groups_group_size_one_drops_everything():
    res = filter_groups(torch.tensor([1.0, 0.0]), 1)
    assert res.keep_mask.tolist() == [False, False]
    assert res.metrics["frac_groups_dropped"] == 1.0
    assert res.metrics["groups_dropped_all_correct"] == 1
    assert res.metrics["groups_dropped_all_wrong"] == 1


def test_filter_groups_errors():
    with pytest.raises(ValueError, match=r"not a multiple of group_size=4"):
        filter_groups(torch.zeros(6), 4)
    with pytest.raises(ValueError, match=r"correct must have shape \[N=4\]"):
        filter_groups(torch.zeros(4), 2, correct=[True])
    with pytest.raises(ValueError, match=r"sequence has length 3, expected N=4"):
        select_rows(torch.ones(4, dtype=torch.bool), [1, 2, 3])
    with pytest.raises(ValueError, match=r"tensor has shape \(3,\), expected first dim N=4"):
        select_rows(torch.ones(4, dtype=torch.bool), torch.zeros(3))
