"""More parity with verl 0.9.1's own functions (issue #25 item 2), in verl's real package: the PPO-clip losses
against ``vanilla``, the covariance losses, GMPO, the group advantage estimators and the rollout IS weights.

Each test runs a script in ``.venv-verl`` (built once by the session fixture of tests/integrations/conftest.py;
slow-marked like it) that feeds the same float64 tensors to verl's function and to ours and asserts equality
(value and gradient) under the verl settings written in the script, or the documented difference:

- (a) ``grpo`` / ``dapo`` / ``dr_grpo`` = verl ``vanilla`` with ``clip_ratio_c`` 1e9 (dual-clip off; with it on
  see tests/integrations/test_integration_verl_objectives.py) and ``loss_agg_mode`` ``seq-mean-token-mean`` / ``token-mean``
  / ``seq-mean-token-sum-norm`` (``loss_scale_factor`` = our ``max_len``, both default to the padded width T),
  verl's ``global_batch_info`` carrying the mini-batch counts (``global_batch_size`` = N). Without
  ``global_batch_size`` verl's seq-mean divides by the non-empty rows, ours by all N rows (asserted with an
  empty row: equal with ``num_seqs`` = the non-empty count).
- (b) ``clip_cov`` = verl ``clip_cov`` when both draw the same random pick: verl draws with
  ``torch.randperm`` on torch's global generator, ours with ``seed=s`` on a fresh generator seeded s, over the
  same candidates in the same (row-major) order, so ``torch.manual_seed(s)`` before verl's call and ``seed=s``
  give the same tokens; also with ``clip_cov_ratio`` 1.0, where every candidate is picked (deterministic). The
  gradients are equal; the values differ as documented in `tepo.losses.clip_cov`: verl multiplies the picked
  tokens' terms by 0, we detach them (value kept), so verl's loss is ours minus their terms' sum / T_tot
  (asserted). ``kl_cov`` = verl ``kl_cov`` (deterministic top-k), value and gradient, with
  ``ppo_kl_coef`` = our ``kl_cov_coef``; verl's *configured* default ``ppo_kl_coef`` is 0.1
  (``PolicyLossConfig`` and actor.yaml; the function's fallback 1.0 is never used), ours 1.0 (the paper's
  beta): verl's default = ours with ``kl_cov_coef=0.1`` (asserted).
- (c) ``gmpo`` = verl ``geo_mean`` with ``clip_ratio_low/high`` = our ``eps_low/high`` (0.4: verl's default
  clip_ratio is 0.2), sequence advantages; verl divides by ``count + 1e-8`` (rtol 1e-8). With token-level
  advantages of mixed sign in a row verl clips each token by its own sign, we by the row mean's: they differ
  (asserted).
- (d) estimators vs ``core_algos.compute_grpo_outcome_advantage`` (``grpo``; ``norm_adv_by_std_in_grpo=False``
  = ``dr_grpo``), ``compute_rloo_outcome_advantage`` (``rloo``) and the vectorized forms, responses of a prompt
  in contiguous rows. A group of one response: verl's loop forms give ``A = R / (1 + eps)`` (grpo) and ``R``
  (rloo), ours 0 (asserted); verl's ``rloo_vectorized`` gives 0 like ours. ``grpo_vectorized`` computes the group
  statistics in float32 (equal to 1e-6).
- (e) ``tis`` / ``seq_tis`` = ``rollout_corr_helper.compute_rollout_correction_weights`` with ``rollout_is``
  ``token`` / ``sequence`` and ``rollout_is_threshold`` = our ``cap``; ``mis`` weights = verl's IcePop weights
  (``rollout_is_threshold="c_low_c_high"``), and ``mis``' kept tokens = ``compute_rollout_rejection_mask`` with
  ``rollout_rs="token_k1"`` and threshold ``"1/c_high_1/c_low"``: verl's k1 is ``-log rho``, so its bounds are
  on ``pi_s / pi_old``; the same string ``"c_low_c_high"`` keeps a different set when the bounds are not
  reciprocal (asserted). verl clamps ``log rho`` (token) or its row sum (sequence) to [-20, 20] before the
  exp: a weight below ``exp(-20)`` differs (asserted), equal everywhere else.
"""

from __future__ import annotations

import textwrap

import pytest

from verl_runner import LOSS_PAIR, SCRIPT_PRELUDE, run_verl_script

pytestmark = pytest.mark.slow

DATA = textwrap.dedent(
    r"""
    from verl.trainer.ppo import core_algos, rollout_corr_helper as rc
    from verl.workers.config.actor import PolicyLossConfig
    from tepo.advantages import compute_advantages
    from tepo.losses import rollout_correction_weights

    gen = torch.Generator().manual_seed(0)
    N, T = 8, 6
    LENGTHS = [6, 4, 2, 5, 3, 6, 1, 4]
    mask = lengths_mask(LENGTHS, T)
    base = -torch.rand(N, T, generator=gen, dtype=F64) * 1.5
    old = (base - 0.5 * torch.randn(N, T, generator=gen, dtype=F64)).clamp(max=-1e-3)
    adv_seq = torch.tensor([1.0, -0.8, 0.6, -1.2, 0.4, -0.5, 0.9, -1.0], dtype=F64).unsqueeze(-1).expand(N, T)
    ratio = torch.exp(base - old)
    report = {}
    """
)

LOSSES_VS_VANILLA = textwrap.dedent(
    r"""
    # the clip range must bite on both sides for the comparison to mean anything
    assert bool(((ratio > 1.28) & mask & (adv_seq > 0)).any()) and bool(((ratio < 0.8) & mask & (adv_seq < 0)).any())
    NO_DUAL = {"clip_ratio_c": 1e9}  # verl's dual clip off: -A * 1e9 never undercuts the clipped term
    report["grpo"] = equal(verl("vanilla", cfg("seq-mean-token-mean", **NO_DUAL)), ours("grpo"), rtol=1e-8)
    report["dapo"] = equal(verl("vanilla", cfg("token-mean", clip_ratio_high=0.28, **NO_DUAL)), ours("dapo"))
    report["dr_grpo"] = equal(verl("vanilla", cfg("seq-mean-token-sum-norm", **NO_DUAL)), ours("dr_grpo"))
    report["dr_grpo_max_len"] = equal(verl("vanilla", cfg("seq-mean-token-sum-norm", loss_scale_factor=16, **NO_DUAL)),
                                      ours("dr_grpo", max_len=16))
    assert abs(report["dr_grpo"] - report["dr_grpo_max_len"]) > 1e-6
    # verl's default clip_ratio_c (3.0) is the dual clip: with it off, ours differs where A < 0 and r > 3
    assert cfg().clip_ratio_c == 3.0

    # An empty row: with global_batch_size given (as verl's trainer does) equal; without it verl's seq-mean
    # divides by the non-empty rows, ours by N (equal with num_seqs = the non-empty count).
    mask_e = torch.cat([mask, torch.zeros(1, T, dtype=torch.bool)])
    def pad(x):
        return torch.cat([x, x[:1]])

    kw = dict(old_logp=pad(old), adv=pad(adv_seq), m=mask_e, lp=pad(base))
    for name, agg in [("grpo", "seq-mean-token-mean"), ("dr_grpo", "seq-mean-token-sum-norm")]:
        given = verl("vanilla", cfg(agg, m=mask_e, **NO_DUAL), **kw)
        equal(given, ours(name, **kw), rtol=1e-8)
        local = verl("vanilla", cfg(agg, m=mask_e, info={"dp_size": 1}, **NO_DUAL), **kw)
        equal(local, ours(name, num_seqs=N, **kw), rtol=1e-8)
        torch.testing.assert_close(local[0], given[0] * (N + 1) / N, rtol=1e-8, atol=0)
        report[f"{name} empty row"] = [float(given[0]), float(local[0])]
    print(json.dumps(report))
    """
)

COVARIANCE = textwrap.dedent(
    r"""
    adv_tok = torch.randn(N, T, generator=gen, dtype=F64)
    n_tok = int(mask.sum())
    pick = {"clip_cov_ratio": 0.1, "clip_cov_lb": 0.02, "clip_cov_ub": 5.0}  # 3 of the band's candidates
    term = torch.maximum(-adv_tok * ratio, -adv_tok * ratio.clamp(0.8, 1.2))  # grpo's per-token term

    def clip_cov(seed, **kw):
        config = cfg("token-mean", policy_loss=PolicyLossConfig(loss_mode="clip_cov", **kw))
        torch.manual_seed(seed)  # verl's torch.randperm draws on the global generator
        v = verl("clip_cov", config, adv=adv_tok)
        o = ours("clip_cov", adv=adv_tok, seed=seed, **kw)
        torch.testing.assert_close(v[1], o[1], rtol=1e-12, atol=1e-15)
        plain = ours("grpo", adv=adv_tok, agg="token-mean")[1]
        picked = mask & (o[1] == 0) & (plain != 0)
        # verl zeroes the picked terms' values, we keep them (detached)
        torch.testing.assert_close(v[0], o[0] - term[picked].sum() / n_tok, rtol=1e-12, atol=1e-15)
        return picked

    picks = {seed: clip_cov(seed, **pick) for seed in (0, 1, 2, 3)}
    assert all(int(p.sum()) == 3 for p in picks.values()), {s: int(p.sum()) for s, p in picks.items()}
    assert len({tuple(p.flatten().tolist()) for p in picks.values()}) > 1, "the seed never changed the pick"
    everything = clip_cov(0, **{**pick, "clip_cov_ratio": 1.0})  # every candidate: no randomness
    assert int(everything.sum()) > 3
    report["clip_cov picked"] = {str(s): int(p.sum()) for s, p in picks.items()}
    report["clip_cov all candidates"] = int(everything.sum())

    # kl_cov: the top-k by cov, deterministic
    for ratio_k, coef in [(0.1, 1.0), (0.3, 0.5)]:
        config = cfg("token-mean", policy_loss=PolicyLossConfig(loss_mode="kl_cov", kl_cov_ratio=ratio_k,
                                                                ppo_kl_coef=coef))
        report[f"kl_cov {ratio_k} {coef}"] = equal(verl("kl_cov", config, adv=adv_tok),
                                                   ours("kl_cov", adv=adv_tok, kl_cov_ratio=ratio_k, kl_cov_coef=coef))
    assert (PolicyLossConfig().kl_cov_ratio, PolicyLossConfig().ppo_kl_coef) == (0.0002, 0.1)
    default = verl("kl_cov", cfg("token-mean", policy_loss=PolicyLossConfig(loss_mode="kl_cov")), adv=adv_tok)
    report["kl_cov verl default"] = equal(default, ours("kl_cov", adv=adv_tok, kl_cov_coef=0.1))
    assert abs(report["kl_cov verl default"] - float(ours("kl_cov", adv=adv_tok)[0])) > 1e-6  # our 1.0 differs
    print(json.dumps(report))
    """
)

GMPO = textwrap.dedent(
    r"""
    assert bool(((base - old).abs() > 0.4).logical_and(mask).any())  # the log-space clip bites
    report["gmpo"] = equal(verl("geo_mean", cfg(clip_ratio_low=0.4, clip_ratio_high=0.4)), ours("gmpo"), rtol=1e-8)
    report["gmpo eps 0.2"] = equal(verl("geo_mean", cfg()), ours("gmpo", eps_low=0.2, eps_high=0.2), rtol=1e-8)
    # token advantages of one sign per row: equal (verl's per-token sign is the row mean's)
    scale = 0.5 + torch.rand(N, T, generator=gen, dtype=F64)
    same_sign = adv_seq * scale
    report["gmpo token adv, one sign"] = equal(
        verl("geo_mean", cfg(clip_ratio_low=0.4, clip_ratio_high=0.4), adv=same_sign), ours("gmpo", adv=same_sign),
        rtol=1e-8)
    mixed = torch.randn(N, T, generator=gen, dtype=F64)
    v = verl("geo_mean", cfg(clip_ratio_low=0.4, clip_ratio_high=0.4), adv=mixed)
    o = ours("gmpo", adv=mixed)
    assert not torch.allclose(v[1], o[1], rtol=1e-6, atol=1e-9), "mixed-sign token advantages: expected to differ"
    report["gmpo token adv, mixed signs differ"] = [float(v[0]), float(o[0])]
    print(json.dumps(report))
    """
)

ESTIMATORS = textwrap.dedent(
    r"""
    G = 4
    rewards = torch.tensor([1.0, 0.0, 0.3, 0.7, 0.5, 0.5, 0.5, 0.5], dtype=F64)  # second group: zero variance
    last = mask.sum(-1) - 1
    token_rewards = torch.zeros(N, T, dtype=F64)
    token_rewards[torch.arange(N), last] = rewards
    index = np.array([0] * G + [1] * G)
    m64 = mask.to(F64)

    def ours_adv(name, r=rewards, g=G, m=mask):
        return compute_advantages(name, r, g, mask=m).unsqueeze(-1) * m

    def close(a, b, rtol=1e-12, atol=1e-15):
        torch.testing.assert_close(a.to(F64), b.to(F64), rtol=rtol, atol=atol)
        return float((a.to(F64) - b.to(F64)).abs().max())

    v_grpo, _ = core_algos.compute_grpo_outcome_advantage(token_rewards.clone(), m64, index)
    report["grpo"] = close(ours_adv("grpo"), v_grpo)
    v_dr, _ = core_algos.compute_grpo_outcome_advantage(token_rewards.clone(), m64, index,
                                                        norm_adv_by_std_in_grpo=False)
    report["dr_grpo"] = close(ours_adv("dr_grpo"), v_dr)
    v_rloo, _ = core_algos.compute_rloo_outcome_advantage(token_rewards.clone(), m64, index)
    report["rloo"] = close(ours_adv("rloo"), v_rloo)
    # the registered names resolve to these functions; the vectorized forms
    assert core_algos.get_adv_estimator_fn("grpo") is core_algos.compute_grpo_outcome_advantage
    assert core_algos.get_adv_estimator_fn("rloo") is core_algos.compute_rloo_outcome_advantage
    v_rloo_vec, _ = core_algos.get_adv_estimator_fn("rloo_vectorized")(token_rewards.clone(), m64, index)
    report["rloo_vectorized"] = close(ours_adv("rloo"), v_rloo_vec)
    v_grpo_vec, _ = core_algos.get_adv_estimator_fn("grpo_vectorized")(token_rewards.clone(), m64, index)
    report["grpo_vectorized"] = close(ours_adv("grpo"), v_grpo_vec, rtol=1e-6, atol=1e-6)  # float32 statistics
    v_dr_vec, _ = core_algos.get_adv_estimator_fn("grpo_vectorized")(token_rewards.clone(), m64, index,
                                                                     norm_adv_by_std_in_grpo=False)
    report["dr_grpo_vectorized"] = close(ours_adv("dr_grpo"), v_dr_vec, rtol=1e-6, atol=1e-6)
    assert float(ours_adv("grpo").abs().sum()) > 0

    # G = 1: verl's loop forms keep R (grpo: mean 0, std 1), ours and verl's rloo_vectorized give 0
    single = np.arange(N)
    v1, _ = core_algos.compute_grpo_outcome_advantage(token_rewards.clone(), m64, single)
    one = torch.tensor(1.0) + 1e-6  # verl adds eps to a float32 std of 1
    close(v1, token_rewards.sum(-1, keepdim=True) * m64 / one.to(F64))
    v1r, _ = core_algos.compute_rloo_outcome_advantage(token_rewards.clone(), m64, single)
    close(v1r, token_rewards.sum(-1, keepdim=True) * m64)
    for name in ("grpo", "dr_grpo", "rloo"):
        assert float(ours_adv(name, g=1).abs().sum()) == 0.0, name
    v1v, _ = core_algos.get_adv_estimator_fn("rloo_vectorized")(token_rewards.clone(), m64, single)
    assert float(v1v.abs().sum()) == 0.0
    report["G=1 verl grpo sum"] = float(v1.sum())
    print(json.dumps(report))
    """
)

ROLLOUT_IS = textwrap.dedent(
    r"""
    roll_old = -torch.rand(N, T, generator=gen, dtype=F64) * 2
    d = 0.5 * torch.randn(N, T, generator=gen, dtype=F64)  # log rho = old - rollout
    rollout = roll_old - d
    log_ratio = torch.where(mask, d, torch.zeros((), dtype=F64))
    m64 = mask.to(F64)

    def close(a, b, rtol=1e-12, atol=1e-15):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)
        return float((a - b).abs().max())

    for level, mode, cap in [("token", "tis", 2.0), ("token", "tis", 1.2), ("sequence", "seq_tis", 1.1),
                             ("sequence", "seq_tis", 1.02)]:
        verl_w, _ = rc.compute_rollout_correction_weights(log_ratio, m64, rollout_is=level, rollout_is_threshold=cap)
        ours_w, keep, _ = rollout_correction_weights(roll_old, rollout, mask, mode=mode, cap=cap)
        assert torch.equal(keep, mask)
        report[f"{mode} {cap}"] = close(ours_w, verl_w * mask)
        assert bool(((ours_w == cap) & mask).any()) and bool(((ours_w < cap) & mask).any()), (mode, cap)

    # mis = verl IcePop weights (zero outside [c_low, c_high]); its kept tokens = token_k1 with reciprocal bounds
    for c_low, c_high in [(0.5, 2.0), (0.8, 1.5)]:
        verl_w, _ = rc.compute_rollout_correction_weights(log_ratio, m64, rollout_is="token",
                                                          rollout_is_threshold=f"{c_low}_{c_high}")
        ours_w, keep, _ = rollout_correction_weights(roll_old, rollout, mask, mode="mis", c_low=c_low, c_high=c_high)
        assert 0 < int(keep.sum()) < int(mask.sum()), (c_low, c_high)
        report[f"mis {c_low}_{c_high}"] = close(ours_w, verl_w * mask)
        verl_keep, _ = rc.compute_rollout_rejection_mask(log_ratio, m64, rollout_rs="token_k1",
                                                         rollout_rs_threshold=f"{1 / c_high}_{1 / c_low}")
        assert torch.equal(keep, verl_keep.bool() & mask), (c_low, c_high)
    # the same string on verl's k1 (bounds on pi_s / pi_old = 1 / rho) keeps another set when not reciprocal
    same_string, _ = rc.compute_rollout_rejection_mask(log_ratio, m64, rollout_rs="token_k1",
                                                       rollout_rs_threshold="0.8_1.5")
    _, keep, _ = rollout_correction_weights(roll_old, rollout, mask, mode="mis", c_low=0.8, c_high=1.5)
    assert not torch.equal(keep, same_string.bool() & mask)
    report["token_k1 0.8_1.5 vs mis differ on"] = int((keep != (same_string.bool() & mask)).sum())

    # beyond verl's SAFETY_BOUND (log rho < -20): verl's weight is exp(-20), ours the true ratio
    far = d.clone()
    far[0, 0] = -30.0
    far_ratio = torch.where(mask, far, torch.zeros((), dtype=F64))
    verl_t, _ = rc.compute_rollout_correction_weights(far_ratio, m64, rollout_is="token", rollout_is_threshold=2.0)
    ours_t, _, _ = rollout_correction_weights(roll_old, roll_old - far, mask, mode="tis", cap=2.0)
    assert math.isclose(float(verl_t[0, 0]), math.exp(-20.0), rel_tol=1e-12)
    assert math.isclose(float(ours_t[0, 0]), math.exp(-30.0), rel_tol=1e-12)
    close(ours_t[mask & (far > -20)], verl_t[mask & (far > -20)])
    verl_s, _ = rc.compute_rollout_correction_weights(far_ratio, m64, rollout_is="sequence", rollout_is_threshold=2.0)
    ours_s, _, _ = rollout_correction_weights(roll_old, roll_old - far, mask, mode="seq_tis", cap=2.0)
    row_sum = float(far[0][mask[0]].sum())
    assert row_sum < -20 and math.isclose(float(verl_s[0, 0]), math.exp(-20.0), rel_tol=1e-12)
    close(ours_s[0, mask[0]], torch.full((int(mask[0].sum()),), math.exp(row_sum), dtype=F64))
    close(ours_s[1:], verl_s[1:] * mask[1:])
    report["clamp differs"] = [float(verl_t[0, 0]), float(ours_t[0, 0])]
    print(json.dumps(report))
    """
)


def _check(verl_python, tmp_path, body: str) -> dict:
    # the shared data and the loss pair (cfg, verl, ours, equal) first, then the body
    return run_verl_script(verl_python, tmp_path, SCRIPT_PRELUDE + DATA + LOSS_PAIR + body)


def test_grpo_dapo_dr_grpo_equal_verl_vanilla_without_dual_clip(verl_python, tmp_path):
    report = _check(verl_python, tmp_path, LOSSES_VS_VANILLA)
    assert {"grpo", "dapo", "dr_grpo", "dr_grpo_max_len", "grpo empty row", "dr_grpo empty row"} <= set(
        report
    )


def test_clip_cov_and_kl_cov_equal_verls(verl_python, tmp_path):
    report = _check(verl_python, tmp_path, COVARIANCE)
    assert report["clip_cov all candidates"] > 3 and "kl_cov verl default" in report


def test_gmpo_equals_verl_geo_mean(verl_python, tmp_path):
    report = _check(verl_python, tmp_path, GMPO)
    assert {"gmpo", "gmpo eps 0.2", "gmpo token adv, one sign"} <= set(report)


def test_advantage_estimators_equal_verls(verl_python, tmp_path):
    report = _check(verl_python, tmp_path, ESTIMATORS)
    assert report["grpo"] < 1e-12 and report["dr_grpo"] < 1e-12 and report["rloo"] < 1e-12


def test_tis_seq_tis_mis_equal_verls_rollout_is_weights(verl_python, tmp_path):
    report = _check(verl_python, tmp_path, ROLLOUT_IS)
    assert report["token_k1 0.8_1.5 vs mis differ on"] > 0
