"""Every registered policy loss against its closed form, value AND gradient w.r.t. logp, written out by hand.

One small batch (float64, tests/loss_cases.py: its docstring has the table of log-ratios and advantages) serves
all of them: N=3 responses, T=3, row 1 padded by one token and row 2 a one-token response; padded positions hold
NaN; with eps 0.2/0.2 each case of the PPO clip appears.
"""

from __future__ import annotations

import math

import pytest
import torch

from loss_cases import (
    ADV,
    LENS,
    LOGP,
    NAN,
    T_TOT,
    D,
    E,
    N,
    assert_grad,
    batch,
    run,
    seq_mean_token_mean,
    token_mean,
)
from tepo.losses import compute_policy_loss, mini_batch_stats

# ---- the PPO-clipped token-ratio family -----------------------------------------------------------------------

# -min(r*A, clip(r)*A) per token with eps 0.2/0.2, by the case table of the module docstring.
GRPO_TERMS = [[-E(0.1) * 1, -E(-0.3) * 1, -1.2 * 1], [-0.8 * -2, -E(0.25) * -2], [-1.2 * 0.5]]
# d term / d logp = -A*r where unclipped, 0 where the clipped branch is active.
GRPO_TERM_GRADS = [[-E(0.1), -E(-0.3), 0.0], [0.0, 2 * E(0.25)], [0.0]]


def test_grpo_value_gradient_and_clip_metrics():
    value, grad, metrics = run("grpo")
    assert value == pytest.approx(seq_mean_token_mean(GRPO_TERMS), rel=1e-12)
    assert_grad(grad, [[g / (N * LENS[i]) for g in row] for i, row in enumerate(GRPO_TERM_GRADS)])
    assert metrics["clip_frac_high"] == pytest.approx(2 / 6)
    assert metrics["clip_frac_low"] == pytest.approx(1 / 6)
    assert metrics["ratio_max"] == pytest.approx(E(0.5))
    all_d = [0.1, -0.3, 0.3, -0.5, 0.25, 0.5]
    assert metrics["ratio_mean"] == pytest.approx(sum(E(d) for d in all_d) / 6)
    assert metrics["approx_kl"] == pytest.approx(sum(E(d) - 1 - d for d in all_d) / 6)
    assert metrics["policy_loss"] == pytest.approx(value)


def test_dapo_clip_higher_token_mean():
    # eps_high 0.28: row 0 t2 (1.350) and row 2 (1.649) are now clipped at 1.28.
    terms = [[-E(0.1), -E(-0.3), -1.28], [-0.8 * -2, -E(0.25) * -2], [-1.28 * 0.5]]
    value, grad, metrics = run("dapo")
    assert value == pytest.approx(token_mean(terms), rel=1e-12)
    assert_grad(grad, [[g / T_TOT for g in row] for row in GRPO_TERM_GRADS])
    assert metrics["clip_frac_high"] == pytest.approx(2 / 6)


def test_dapo_eps_high_above_every_ratio_unclips_the_upper_side():
    terms = [[-E(0.1), -E(-0.3), -E(0.3)], [-0.8 * -2, -E(0.25) * -2], [-E(0.5) * 0.5]]
    grads = [[-E(0.1), -E(-0.3), -E(0.3)], [0.0, 2 * E(0.25)], [-0.5 * E(0.5)]]
    value, grad, metrics = run("dapo", eps_high=0.7)
    assert value == pytest.approx(token_mean(terms), rel=1e-12)
    assert_grad(grad, [[g / T_TOT for g in row] for row in grads])
    assert metrics["clip_frac_high"] == 0.0


def test_dr_grpo_sum_over_n_times_max_len():
    flat_sum = sum(sum(r) for r in GRPO_TERMS)
    value, grad, _ = run("dr_grpo")  # L_max defaults to T = 3
    assert value == pytest.approx(flat_sum / (N * 3), rel=1e-12)
    assert_grad(grad, [[g / (N * 3) for g in row] for row in GRPO_TERM_GRADS])
    value, grad, _ = run("dr_grpo", max_len=8)
    assert value == pytest.approx(flat_sum / (N * 8), rel=1e-12)
    assert_grad(grad, [[g / (N * 8) for g in row] for row in GRPO_TERM_GRADS])


def test_cispo_truncated_detached_weight_times_logp():
    w = [[E(0.1), E(-0.3), 1.28], [E(-0.5), 1.28], [1.28]]  # min(r, 1 + 0.28)
    terms = [[-w[i][t] * ADV[i] * LOGP[i][t] for t in range(LENS[i])] for i in range(N)]
    value, grad, metrics = run("cispo")
    assert value == pytest.approx(token_mean(terms), rel=1e-12)
    # d/dlogp of -sg[w]*A*logp is -w*A: every token keeps a gradient, clipped or not.
    assert_grad(grad, [[-w[i][t] * ADV[i] / T_TOT for t in range(LENS[i])] for i in range(N)])
    assert metrics["clip_frac_high"] == pytest.approx(3 / 6)  # r > 1.28: row0 t2, row1 t1, row2 t0
    assert metrics["clip_frac_low"] == 0.0


def test_prefix_is_running_mean_ratio():
    # s[i,t] = exp(mean_{j<=t} d): row0 [0.1, -0.1, 0.1/3], row1 [-0.5, -0.125], row2 [0.5].
    s0 = [E(0.1), E(-0.1), E(0.1 / 3)]  # all inside [0.8, 1.2]: unclipped
    s1 = [E(-0.5), E(-0.125)]  # 0.607 < 0.8 with A<0: clipped; 0.882 inside
    terms = [[-s * 1 for s in s0], [-0.8 * -2, -s1[1] * -2], [-1.2 * 0.5]]
    # d(-A*s_t)/dlogp_j = -A*s_t/t for every j <= t (t counted from 1).
    g0 = [
        -(s0[0] / 1 + s0[1] / 2 + s0[2] / 3),
        -(s0[1] / 2 + s0[2] / 3),
        -(s0[2] / 3),
    ]
    g1 = [2 * s1[1] / 2, 2 * s1[1] / 2]
    value, grad, metrics = run("prefix_is")
    assert value == pytest.approx(token_mean(terms), rel=1e-12)
    assert_grad(grad, [[g / T_TOT for g in g0], [g / T_TOT for g in g1], [0.0]])
    assert metrics["clip_frac_low"] == pytest.approx(1 / 6)
    assert metrics["clip_frac_high"] == pytest.approx(1 / 6)


# ---- sequence-ratio family ------------------------------------------------------------------------------------

S = [E((0.1 - 0.3 + 0.3) / 3), E((-0.5 + 0.25) / 2), E(0.5)]  # geometric-mean ratios 1.034, 0.882, 1.649


def test_tepo_value_and_algorithm1_gradient():
    # s_0, s_1 inside [0.8, 1.2]; s_2 = 1.649 with A>0 is clipped at 1.2 (zero gradient for row 2).
    value, grad, metrics = run("tepo")
    expected = -(3 * S[0] * ADV[0] + 2 * S[1] * ADV[1] + 1 * 1.2 * ADV[2]) / T_TOT
    assert value == pytest.approx(expected, rel=1e-12)
    # Algorithm 1: -s_i*A_i/T_tot on every token of an unclipped sequence.
    assert_grad(grad, [[-S[0] * ADV[0] / T_TOT] * 3, [-S[1] * ADV[1] / T_TOT] * 2, [0.0]])
    assert metrics["seq_clip_frac_high"] == pytest.approx(1 / 3)
    assert metrics["seq_clip_frac_low"] == 0.0
    assert metrics["clip_frac_high"] == pytest.approx(1 / 6)
    assert metrics["seq_ratio_max"] == pytest.approx(E(0.5))
    # The ratio distribution over the three rows (1.034, 0.882, 1.649): min, and linear-interpolated quantiles.
    assert metrics["seq_ratio_min"] == pytest.approx(S[1])
    assert metrics["seq_ratio_p50"] == pytest.approx(S[0], rel=1e-6)
    assert metrics["seq_ratio_p10"] == pytest.approx(S[1] + 0.2 * (S[0] - S[1]), rel=1e-6)
    assert metrics["seq_ratio_p90"] == pytest.approx(S[0] + 0.8 * (S[2] - S[0]), rel=1e-6)


def test_tepo_clipped_low_with_negative_advantage():
    # eps 0.05: s_1 = 0.882 < 0.95 with A<0 -> clipped (constant); s_0 = 1.034 inside; s_2 clipped at 1.05.
    value, grad, metrics = run("tepo", eps=0.05)
    expected = -(3 * S[0] * ADV[0] + 2 * 0.95 * ADV[1] + 1 * 1.05 * ADV[2]) / T_TOT
    assert value == pytest.approx(expected, rel=1e-12)
    assert_grad(grad, [[-S[0] * ADV[0] / T_TOT] * 3, [0.0, 0.0], [0.0]])
    assert metrics["seq_clip_frac_low"] == pytest.approx(1 / 3)


def test_gspo_default_eps_clips_every_sequence():
    # eps 3e-4/4e-4: s_0 > 1.0004 (A>0), s_1 < 0.9997 (A<0), s_2 > 1.0004 (A>0): all clipped, zero gradient.
    value, grad, metrics = run("gspo")
    expected = -(1.0004 * ADV[0] + 0.9997 * ADV[1] + 1.0004 * ADV[2]) / N
    assert value == pytest.approx(expected, rel=1e-12)
    assert_grad(grad, [[0.0] * 3, [0.0] * 2, [0.0]])
    assert metrics["seq_clip_frac_high"] == pytest.approx(2 / 3)
    assert metrics["seq_clip_frac_low"] == pytest.approx(1 / 3)


def test_gspo_unclipped_equal_sequence_weights():
    value, grad, _ = run("gspo", eps=0.2)
    expected = -(S[0] * ADV[0] + S[1] * ADV[1] + 1.2 * ADV[2]) / N
    assert value == pytest.approx(expected, rel=1e-12)
    # d(-s_i*A_i)/dlogp[i,t] = -s_i*A_i/|o_i|, then 1/N.
    assert_grad(grad, [[-S[0] * ADV[0] / (3 * N)] * 3, [-S[1] * ADV[1] / (2 * N)] * 2, [0.0]])


def test_gmpo_token_clip_in_log_space():
    # Row 0 (A>0): all |d| < 0.4, unclipped. Row 1 (A<0): max(d, clamp(d)): -0.5 -> -0.4 (clipped), 0.25 kept.
    # Row 2 (A>0): min(0.5, 0.4) = 0.4 (clipped).
    g = [E((0.1 - 0.3 + 0.3) / 3), E((-0.4 + 0.25) / 2), E(0.4)]
    value, grad, metrics = run("gmpo")
    assert value == pytest.approx(-(ADV[0] * g[0] + ADV[1] * g[1] + ADV[2] * g[2]) / N, rel=1e-12)
    # d(-A_i*g_i)/dlogp[i,t] = -A_i*g_i/|o_i| for unclipped tokens, 0 for clipped ones; then 1/N.
    assert_grad(grad, [[-ADV[0] * g[0] / (3 * N)] * 3, [0.0, -ADV[1] * g[1] / (2 * N)], [0.0]])
    assert metrics["clip_frac_low"] == pytest.approx(1 / 6)
    assert metrics["clip_frac_high"] == pytest.approx(1 / 6)


def test_reinforce_is_detached_sequence_weight():
    value, grad, metrics = run("reinforce_is")
    expected = -sum(S[i] * ADV[i] * sum(LOGP[i]) for i in range(N)) / T_TOT
    assert value == pytest.approx(expected, rel=1e-12)
    # No clipping, and sg[s_i]: the gradient is -s_i*A_i/T_tot on each token, including row 2.
    assert_grad(grad, [[-S[i] * ADV[i] / T_TOT] * LENS[i] for i in range(N)])
    assert metrics["clip_frac_high"] == metrics["seq_clip_frac_high"] == 0.0


# ---- covariance family ----------------------------------------------------------------------------------------

FLAT_LOGP = [x for row in LOGP for x in row]
FLAT_ADV = [ADV[i] for i in range(N) for _ in range(LENS[i])]
MEAN_LOGP = sum(FLAT_LOGP) / 6
MEAN_ADV = sum(FLAT_ADV) / 6  # (3*1 - 2*2 + 0.5) / 6 = -0.5/6
COV = [(lp - MEAN_LOGP) * (a - MEAN_ADV) for lp, a in zip(FLAT_LOGP, FLAT_ADV)]
FLAT_TERMS = [x for row in GRPO_TERMS for x in row]
FLAT_GRADS = [x for row in GRPO_TERM_GRADS for x in row]
CLIPPED = [False, False, True, True, False, True]  # where the PPO clip is active (grads above are 0)


def _rows(flat):
    return [flat[0:3], flat[3:5], flat[5:6]]


def test_covariance_stats_hand_values():
    b = batch()
    stats = mini_batch_stats(
        "cov_gauss", logp=b["logp"], old_logp=b["old_logp"], advantages=b["advantages"], mask=b["mask"]
    )
    mean_cov = sum(COV) / 6
    assert stats.mean_logp == pytest.approx(MEAN_LOGP, rel=1e-12)
    assert stats.mean_adv == pytest.approx(MEAN_ADV, rel=1e-12)
    assert stats.std_cov == pytest.approx(math.sqrt(sum((c - mean_cov) ** 2 for c in COV) / 6), rel=1e-12)


def test_clip_cov_detaches_every_in_band_unclipped_token_when_ratio_is_one():
    lb, ub = -0.5, 0.5
    band = [lb <= c <= ub and not clipped for c, clipped in zip(COV, CLIPPED)]
    assert 0 < sum(band) < 3  # the case is informative: some unclipped tokens are in the band, some are not
    value, grad, metrics = run("clip_cov", clip_cov_ratio=1.0, clip_cov_lb=lb, clip_cov_ub=ub)
    assert value == pytest.approx(sum(FLAT_TERMS) / T_TOT, rel=1e-12)  # sg[] keeps the value
    expected = [0.0 if b else g / T_TOT for b, g in zip(band, FLAT_GRADS)]
    assert_grad(grad, _rows(expected))
    assert metrics["cov_clip_frac"] == pytest.approx(sum(band) / 6)


def test_clip_cov_default_share_detaches_one_random_candidate_reproducibly():
    lb, ub = -10.0, 10.0  # every unclipped token is a candidate: indices 0, 1, 4
    candidates = [i for i, clipped in enumerate(CLIPPED) if not clipped]
    chosen = set()
    for seed in range(12):
        value, grad, metrics = run("clip_cov", clip_cov_lb=lb, clip_cov_ub=ub, seed=seed)
        _, grad_again, _ = run("clip_cov", clip_cov_lb=lb, clip_cov_ub=ub, seed=seed)
        torch.testing.assert_close(grad, grad_again, rtol=0, atol=0)
        flat = grad[batch()["mask"].bool()].tolist()
        zeroed = [i for i in candidates if flat[i] == 0.0]
        assert len(zeroed) == 1  # max(1, int(2e-4 * 6)) = 1 token
        for i in candidates:
            if i not in zeroed:
                assert flat[i] == pytest.approx(FLAT_GRADS[i] / T_TOT, rel=1e-12)
        assert metrics["cov_clip_frac"] == pytest.approx(1 / 6)
        assert value == pytest.approx(sum(FLAT_TERMS) / T_TOT, rel=1e-12)
        chosen.update(zeroed)
    assert len(chosen) > 1  # the pick is random, not a fixed token
    gen = torch.Generator().manual_seed(3)
    _, grad_gen, _ = run("clip_cov", clip_cov_lb=lb, clip_cov_ub=ub, generator=gen)
    _, grad_seed, _ = run("clip_cov", clip_cov_lb=lb, clip_cov_ub=ub, seed=3)
    torch.testing.assert_close(grad_gen, grad_seed, rtol=0, atol=0)


KL_BASE = [-E(d) * a for d, a in zip([x for row in D for x in row], FLAT_ADV)]
KL_BASE_GRAD = [-E(d) * a for d, a in zip([x for row in D for x in row], FLAT_ADV)]
FLAT_D = [x for row in D for x in row]


@pytest.mark.parametrize(("ratio", "coef", "k"), [(2e-4, 1.0, 1), (0.5, 0.3, 3)])
def test_kl_cov_penalises_top_covariance_tokens(ratio, coef, k):
    top = sorted(range(6), key=lambda i: COV[i], reverse=True)[:k]
    value, grad, metrics = run("kl_cov", kl_cov_ratio=ratio, kl_cov_coef=coef)
    expected = (sum(KL_BASE) + coef * sum(abs(FLAT_D[i]) for i in top)) / T_TOT
    assert value == pytest.approx(expected, rel=1e-12)
    # d|d|/dlogp = sign(d); no clipping: -A*r on every token.
    grads = [
        (KL_BASE_GRAD[i] + (coef * math.copysign(1, FLAT_D[i]) if i in top else 0.0)) / T_TOT
        for i in range(6)
    ]
    assert_grad(grad, _rows(grads))
    assert metrics["kl_cov_frac"] == pytest.approx(k / 6)
    assert metrics["kl_cov_abs_kl"] == pytest.approx(sum(abs(d) for d in FLAT_D) / 6)


def test_cov_gauss_gaussian_weights():
    mean_cov = sum(COV) / 6
    sigma = math.sqrt(sum((c - mean_cov) ** 2 for c in COV) / 6)
    w = [E(-(c**2) / (2 * sigma**2)) for c in COV]
    value, grad, metrics = run("cov_gauss")
    assert value == pytest.approx(sum(wi * li for wi, li in zip(w, FLAT_TERMS)) / T_TOT, rel=1e-12)
    assert_grad(grad, _rows([wi * gi / T_TOT for wi, gi in zip(w, FLAT_GRADS)]))
    assert metrics["cov_weight_mean"] == pytest.approx(sum(w) / 6)


def test_prefix_is_prefix_length_counts_only_valid_tokens():
    # A hole at t=0 (left padding or a masked tool-output token): the prefix of t=1 has length 1, of t=2 length 2.
    logp = torch.tensor([[NAN, -1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[NAN, -1.1, -1.95]], dtype=torch.float64)
    loss, _ = compute_policy_loss(
        "prefix_is", logp=logp, old_logp=old, advantages=torch.tensor([1.0]), mask=torch.tensor([[0, 1, 1]])
    )
    loss.backward()
    s1, s2 = E(0.1), E((0.1 - 0.05) / 2)  # both inside [0.8, 1.2]
    assert loss.item() == pytest.approx(-(s1 + s2) / 2, rel=1e-12)
    torch.testing.assert_close(
        logp.grad, torch.tensor([[0.0, -(s1 + s2 / 2) / 2, -(s2 / 2) / 2]], dtype=torch.float64)
    )
