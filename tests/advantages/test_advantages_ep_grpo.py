"""EP-GRPO (2605.04960) as ALGORITHMS.md reads it, part by part, on hand-checkable tensors.

Most cases use ``base="dr_grpo"`` (``A_i = R_i - mean``, no std) so the base advantage is exact by hand, and
``gamma=0`` (gate ``W = sigmoid(0) = 1/2`` everywhere) where the gate is not the part under test.
"""

from __future__ import annotations

import math

import pytest
import torch

from tepo.advantages import compute_advantages, estimator_requires
from tepo.advantages.ep_grpo import progress_buckets
from tepo.advantages.filtering import all_equal_group_stats

NAN = float("nan")


def close(actual, expected, tol=1e-5):
    expected = torch.as_tensor(expected, dtype=actual.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.allclose(actual, expected, atol=tol, rtol=0), (actual, expected)


def ep(rewards, group_size, *, entropy, old, ref, mask=None, **options):
    def f64(x):
        return torch.as_tensor(x, dtype=torch.float64)

    mask = torch.ones_like(f64(entropy)) if mask is None else mask
    return compute_advantages(
        "ep_grpo",
        f64(rewards),
        group_size,
        entropy=f64(entropy),
        old_logp=f64(old),
        ref_logp=f64(ref),
        mask=torch.as_tensor(mask),
        **options,
    )


def test_declares_what_it_reads_and_is_token_level():
    assert estimator_requires("ep_grpo") == {"entropy", "old_logp", "ref_logp", "mask"}
    # A base's own needs are added (rloo reads nothing more; a base that reads logp would add it).
    assert estimator_requires("ep_grpo", {"base": "rloo"}) == {"entropy", "old_logp", "ref_logp", "mask"}


def test_entropy_gate_hand_values():
    # One group, G = 2, H = (1, 3 | 1, 3): mean 2, population std 1 -> z = (-1, 1 | -1, 1) / (1 + 1e-6).
    # gamma = ln 3: sigmoid(-ln 3) = 1/4, sigmoid(ln 3) = 3/4. eta = 0: A = W * A_i, A_i = (+0.5, -0.5).
    zeros = [[0.0, 0.0], [0.0, 0.0]]
    adv = ep(
        [1.0, 0.0], 2, entropy=[[1.0, 3.0], [1.0, 3.0]], old=zeros, ref=zeros,
        gamma=math.log(3), eta=0.0, base="dr_grpo",
    )  # fmt: skip
    close(adv, [[0.125, 0.375], [-0.125, -0.375]])


def test_gate_of_a_group_whose_entropy_does_not_vary_is_one_half():
    # sigma_g = 0: z = 0 exactly (not a rounding residue / 1e-6), W = 1/2 whatever gamma.
    zeros = [[0.0, 0.0], [0.0, 0.0]]
    adv = ep([1.0, 0.0], 2, entropy=[[0.7] * 2] * 2, old=zeros, ref=zeros, gamma=50.0, base="dr_grpo")
    close(adv, [[0.25, 0.25], [-0.25, -0.25]], tol=0)


def test_zero_variance_polarity_all_correct_and_all_wrong():
    # Two groups of G = 2, one token each, K = 1, gamma 0 (W = 1/2), eta 1. Both groups have all-equal rewards,
    # so A_i = 0 and d = sign(R - 0.5): +1 for the all-correct group, -1 for the all-wrong one.
    # s = old - ref = (0.3, -0.1) in each group: mean 0.1, population std 0.2 -> s~ = (+1, -1) * 0.2/(0.2 + 1e-6).
    old = [[0.3], [-0.1], [0.3], [-0.1]]
    zeros = [[0.0]] * 4
    h = [[1.0]] * 4
    adv = ep([1.0, 1.0, 0.0, 0.0], 2, entropy=h, old=old, ref=zeros, gamma=0.0, eta=1.0, num_buckets=1)
    close(adv, [[0.5], [-0.5], [-0.5], [0.5]])
    # theta_reward decides the side: above both rewards, the all-correct group is pushed down too.
    adv = ep([1.0, 1.0, 0.0, 0.0], 2, entropy=h, old=old, ref=zeros, gamma=0.0, eta=1.0, num_buckets=1,
             theta_reward=1.5)  # fmt: skip
    close(adv, [[-0.5], [0.5], [-0.5], [0.5]])


def test_polarity_follows_the_advantage_when_rewards_differ():
    # Rewards (0.2, 0.4), theta 0.5: sign(R - theta) would be (-1, -1); the group has spread, so d = sign(A_i)
    # = (-1, +1) with A_i = (-0.1, +0.1). s~ = (+1, -1) (as above), eta 1, W 1/2:
    # A = 0.5 * (-0.1 + (-1)(+1), 0.1 + (+1)(-1)) = (-0.55, -0.45).
    adv = ep([0.2, 0.4], 2, entropy=[[1.0], [1.0]], old=[[0.3], [-0.1]], ref=[[0.0], [0.0]],
             gamma=0.0, eta=1.0, num_buckets=1, base="dr_grpo")  # fmt: skip
    close(adv, [[-0.55], [-0.45]])


def test_buckets_follow_the_entropy_before_each_token():
    # H = (1, 1, 2, 0): C = (0, 1, 2, 4) (exclusive), S = 4 -> C/S = (0, .25, .5, 1).
    h = torch.tensor([[1.0, 1.0, 2.0, 0.0]], dtype=torch.float64)
    m = torch.ones(1, 4, dtype=torch.bool)
    assert progress_buckets(h, m, 2).tolist() == [[0, 0, 1, 1]]  # floor(2x), the last clamped to K-1
    assert progress_buckets(h, m, 4).tolist() == [[0, 1, 2, 3]]  # floor(4x) = (0, 1, 2, 4 -> 3)
    # An inclusive sum (C = 1, 2, 4, 4) would put the first token in bucket 1 of 4: the token's own entropy is
    # not part of its coordinate.
    h = torch.tensor([[3.0, 1.0, 0.0]], dtype=torch.float64)
    assert progress_buckets(h, torch.ones(1, 3, dtype=torch.bool), 2).tolist() == [
        [0, 1, 1]
    ]  # C/S = 0, .75, 1


def test_positional_buckets_when_a_response_has_no_entropy():
    # S_i = 0: b = (K p) // L_i over the L_i = 3 valid tokens: K = 2 -> (0, 0, 1); padding -> 0.
    h = torch.tensor([[0.0, 0.0, 0.0, NAN], [0.5, 0.5, 0.0, 0.0]], dtype=torch.float64)
    m = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    h = torch.where(m, h, 0.0)
    assert progress_buckets(h, m, 2).tolist() == [[0, 0, 1, 0], [0, 1, 1, 1]]
    # A response whose entropy is only a rounding residue (<= 1e-12) is positional too.
    tiny = torch.tensor([[1e-13, 0.0, 0.0]], dtype=torch.float64)
    assert progress_buckets(tiny, torch.ones(1, 3, dtype=torch.bool), 3).tolist() == [[0, 1, 2]]


def test_a_bucket_holding_one_token_gets_no_progress_term():
    # G = 2, K = 2, gamma 0, eta 1, dr_grpo: A_i = (+0.5, -0.5).
    # Row 0: H = (1, 1) -> buckets (0, 1); row 1: one valid token -> bucket 0.
    # Bucket 0 pools (row 0 t0, row 1 t0): s = (0.2, -0.2) -> s~ = (+1, -1). Bucket 1 holds row 0's t1 alone: 0.
    # Row 0: 0.5 * (0.5 + (+1)(1, 0)) = (0.75, 0.25); row 1: 0.5 * (-0.5 + (-1)(-1)) = 0.25, padding 0.
    mask = torch.tensor([[1, 1], [1, 0]])
    adv = ep([1.0, 0.0], 2, entropy=[[1.0, 1.0], [1.0, NAN]], old=[[0.2, 5.0], [-0.2, NAN]],
             ref=[[0.0, 0.0], [0.0, NAN]], mask=mask, gamma=0.0, eta=1.0, num_buckets=2,
             base="dr_grpo")  # fmt: skip
    close(adv, [[0.75, 0.25], [0.25, 0.0]])


def test_std_floor():
    # Bucket std 5e-9: at most the default floor 1e-6 -> s~ = 0 and A = W * A_i; floor 0 lets it through, and the
    # z-score is then (+-5e-9) / (5e-9 + 1e-6) (the 1e-6 in the denominator keeps it small, not +-1).
    kw = dict(entropy=[[1.0], [1.0]], old=[[0.1], [0.1 + 1e-8]], ref=[[0.0], [0.0]], gamma=0.0, eta=1.0,
              num_buckets=1, base="dr_grpo")  # fmt: skip
    close(ep([1.0, 0.0], 2, **kw), [[0.25], [-0.25]], tol=0)
    z = 5e-9 / (5e-9 + 1e-6)
    close(ep([1.0, 0.0], 2, std_floor=0.0, **kw), [[0.5 * (0.5 - z)], [0.5 * (-0.5 - z)]], tol=1e-9)


def test_old_equal_to_ref_gives_the_gated_outcome_term_alone():
    # The first step (the reference is the initial policy): s = 0 everywhere -> s~ = 0 -> A = W * A_i with A_i
    # the default grpo base (unbiased std) and W from the group's entropy, recomputed here from the formula.
    g = torch.Generator().manual_seed(0)
    n, t, group = 6, 5, 3
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    h = torch.rand(n, t, generator=g, dtype=torch.float64) * 2
    old = -torch.rand(n, t, generator=g, dtype=torch.float64)
    mask = torch.ones(n, t)
    mask[1, 3:] = 0
    adv = compute_advantages(
        "ep_grpo", rewards, group, entropy=h, old_logp=old, ref_logp=old.clone(), mask=mask
    )
    base = compute_advantages("grpo", rewards, group).to(torch.float64)
    expected = torch.zeros(n, t, dtype=torch.float64)
    for k in range(n // group):
        rows = slice(k * group, (k + 1) * group)
        valid = h[rows][mask[rows].bool()]
        mu, sigma = valid.mean(), valid.std(unbiased=False)
        w = torch.sigmoid(5.0 * (h[rows] - mu) / (sigma + 1e-6))
        expected[rows] = w * base[rows].unsqueeze(1) * mask[rows]
    close(adv, expected, tol=1e-7)  # the base grpo runs in the rewards' float32
    assert (adv[3:] == 0).all()  # the all-correct group: A_i = 0 and s~ = 0


def test_extra_padding_columns_change_nothing():
    g = torch.Generator().manual_seed(1)
    n, t = 4, 6
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    h, old, ref = (torch.rand(n, t, generator=g) for _ in range(3))
    mask = torch.ones(n, t)
    mask[2, 4:] = 0
    adv = compute_advantages("ep_grpo", rewards, 2, entropy=h, old_logp=old, ref_logp=ref, mask=mask)
    pad = torch.full((n, 3), NAN)
    wide = compute_advantages(
        "ep_grpo", rewards, 2, entropy=torch.cat([h, pad], 1), old_logp=torch.cat([old, pad], 1),
        ref_logp=torch.cat([ref, pad], 1), mask=torch.cat([mask, torch.zeros(n, 3)], 1),
    )  # fmt: skip
    assert torch.equal(wide[:, :t], adv)
    assert (wide[:, t:] == 0).all()
    assert (adv[2, 4:] == 0).all() and torch.isfinite(wide).all()
    assert (adv[2:, :4] != 0).any()  # the all-wrong group still gets a signal


def test_no_gradient_in_the_output():
    h = torch.rand(2, 3, requires_grad=True)
    old = torch.rand(2, 3, requires_grad=True)
    ref = torch.rand(2, 3, requires_grad=True)
    adv = compute_advantages(
        "ep_grpo", torch.tensor([1.0, 0.0]), 2, entropy=h, old_logp=old, ref_logp=ref, mask=torch.ones(2, 3)
    )
    assert not adv.requires_grad and adv.grad_fn is None


@pytest.mark.parametrize(
    "option, value",
    [
        ("gamma", -1.0),
        ("gamma", float("inf")),
        ("eta", float("nan")),
        ("num_buckets", 0),
        ("num_buckets", 2.5),
        ("theta_reward", "half"),
        ("std_floor", -1e-3),
        ("base", "erpo"),
        ("base", "nope"),
        ("base_options", 3),
    ],
)
def test_a_bad_option_is_refused_in_one_line_naming_it(option, value):
    with pytest.raises(ValueError) as err:
        ep([1.0, 0.0], 2, entropy=[[1.0], [1.0]], old=[[0.0], [0.0]], ref=[[0.0], [0.0]], **{option: value})
    message = str(err.value)
    assert "\n" not in message
    assert option in message or repr(value) in message, message


def test_all_equal_group_stats():
    # Groups of 2: (1, 1) all equal, (1, 0) not. Token advantages: the all-equal group has 3 valid tokens, 2 nonzero.
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0])
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1]])
    adv = torch.tensor([[0.1, 0.0], [0.2, 9.0], [0.5, 0.5], [-0.5, -0.5]])
    assert all_equal_group_stats(rewards, adv, mask, 2) == {
        "frac_groups_all_equal": 0.5,
        "frac_all_equal_tokens_advantaged": 2 / 3,
    }
    # Sequence-level advantages (GRPO): an all-equal group has A = 0 on every token.
    seq = compute_advantages("grpo", rewards, 2)
    assert all_equal_group_stats(rewards, seq, mask, 2)["frac_all_equal_tokens_advantaged"] == 0.0
    # No all-equal group: the token share is undefined (None), not 0.
    stats = all_equal_group_stats(torch.tensor([1.0, 0.0]), torch.tensor([1.0, -1.0]), torch.ones(2, 1), 2)
    assert stats == {"frac_groups_all_equal": 0.0, "frac_all_equal_tokens_advantaged": None}
