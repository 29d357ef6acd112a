"""Parity with verl 0.9.1's own code for the KL estimators, ``opo`` and the rollout-correction rejections and
normalisation (issue #25 item 2), in verl's real package.

`CHECK_SCRIPT` runs in ``.venv-verl`` (built once by the session fixture of tests/integrations/conftest.py;
slow-marked like it) and feeds the same float64 tensors to verl's functions and to ours:

- ``core_algos.kl_penalty`` with ``k1``/``k2``/``k3`` (``low_var_kl``) and the straight-through ``k1+``/``k2+``/
  ``k3+``: equal value and gradient to `tepo.losses.kl_estimate`, while ``|ref - logp| <= 20`` and ``k3 <= 10``;
  beyond, verl clamps (the documented difference, asserted).
- ``core_algos.compute_opo_outcome_advantage``: equal to ``compute_advantages("opo", ...)`` (broadcast over the
  response mask), with the responses of a prompt in contiguous rows (verl groups by ``index``).
- ``rollout_corr_helper.compute_rollout_rejection_mask`` with ``rollout_rs="seq_mean_k3"`` / ``"seq_max_k2"``:
  the same kept tokens as ``mode="seq_k3"`` / ``"seq_max_k2"``, log-ratio clamp at +-20 included.
- ``rollout_corr_helper.compute_rollout_correction_weights`` with ``rollout_is_batch_normalize=True``: equal to
  ``normalize=True`` for ``tis`` (``rollout_is="token"``) and ``seq_tis`` (``"sequence"``, one weight per
  sequence), up to verl's ``+ 1e-8`` in its masked means (relative 1e-8/count); for IcePop thresholds (verl's
  analogue of ``mis``) the documented difference: verl averages over every valid token, zeros included, ours over
  the kept tokens, so verl's weights are ours times ``valid / kept``.
"""

from __future__ import annotations

import textwrap

import pytest

from verl_runner import SCRIPT_PRELUDE, run_verl_script

pytestmark = pytest.mark.slow

CHECK_SCRIPT = textwrap.dedent(
    r"""
    import functools
    from verl.trainer.ppo import core_algos, rollout_corr_helper as rc
    from tepo.advantages import compute_advantages
    from tepo.losses import kl_estimate, rollout_correction_weights

    gen = torch.Generator().manual_seed(0)
    N, T = 6, 5
    mask = lengths_mask([5, 3, 1, 4, 2, 5], T)
    report = {}
    close = functools.partial(close, atol=1e-15)  # the prelude's comparison, tighter

    # ---- KL estimators: verl kl_penalty vs kl_estimate, value and gradient ----
    logp0 = -torch.rand(N, T, generator=gen, dtype=F64) * 2
    ref = logp0 + 0.5 * torch.randn(N, T, generator=gen, dtype=F64)
    for verl_name, ours in [("k1", "k1"), ("kl", "k1"), ("k2", "k2"), ("mse", "k2"), ("k3", "k3"),
                            ("low_var_kl", "k3"), ("k1+", "k1+"), ("k2+", "k2+"), ("k3+", "k3+")]:
        a = logp0.clone().requires_grad_(True)
        b = logp0.clone().requires_grad_(True)
        va = core_algos.kl_penalty(a, ref, verl_name)
        vb = kl_estimate(b, ref, ours)
        va.sum().backward(); vb.sum().backward()
        report[f"kl {verl_name}"] = [close(vb, va), close(b.grad, a.grad)]
    # Beyond verl's clamps (ref - logp in [-20, 20], k3 in [-10, 10]): verl's k3 saturates at 10, ours does not.
    far_logp = torch.tensor([0.0, 0.0], dtype=F64)
    far_ref = torch.tensor([25.0, 2.0], dtype=F64)
    verl_far = core_algos.kl_penalty(far_logp, far_ref, "k3")
    ours_far = kl_estimate(far_logp, far_ref, "k3")
    # Ours is k3 = exp(25) - 25 - 1, unclamped, to one ulp of float64 at 7.2e10 (in [2^36, 2^37): ulp 2^-16).
    # math.exp is correctly rounded (within 0.5 ulp; here 0.46 above the true value); torch's float64 exp is
    # faithful, not correctly rounded (within 1 ulp; here the double below, 0.54 under): two doubles less than
    # 1.5 ulp apart are at most one ulp apart. Subtracting 25 and 1 is exact on both sides (same binade).
    far_k3 = math.exp(25.0) - 26.0
    assert float(verl_far[0]) == 10.0, verl_far
    assert abs(float(ours_far[0]) - far_k3) <= math.ulp(far_k3), (ours_far, far_k3)
    assert float(verl_far[1]) == float(ours_far[1])  # 2.0: inside both
    report["kl k3 clamp difference"] = [float(verl_far[0]), float(ours_far[0])]

    # ---- opo: verl compute_opo_outcome_advantage vs compute_advantages("opo") ----
    G = 3
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 0.0, 0.0], dtype=F64)  # second group all equal
    token_rewards = torch.zeros(N, T, dtype=F64)
    last = mask.sum(-1) - 1
    token_rewards[torch.arange(N), last] = rewards
    index = np.array([0, 0, 0, 1, 1, 1])
    verl_adv, _ = core_algos.compute_opo_outcome_advantage(token_rewards, mask.to(F64), index)
    ours_adv = compute_advantages("opo", rewards, G, mask=mask).unsqueeze(-1) * mask
    report["opo"] = close(ours_adv, verl_adv)

    # ---- rejections: verl rollout_rs vs our modes ----
    old = -torch.rand(N, T, generator=gen, dtype=F64) * 2
    d = 0.6 * torch.randn(N, T, generator=gen, dtype=F64)
    d[5, 2] = 30.0  # beyond verl's SAFETY_BOUND: both clamp to 20
    rollout = old - d  # log_ratio = old - rollout = d
    log_ratio = torch.where(mask, d, torch.zeros((), dtype=F64))
    for verl_rs, mode, threshold in [("seq_mean_k3", "seq_k3", 0.1), ("seq_mean_k3", "seq_k3", 0.01),
                                     ("seq_max_k2", "seq_max_k2", 0.3), ("seq_max_k2", "seq_max_k2", 2.5)]:
        verl_mask, _ = rc.compute_rollout_rejection_mask(log_ratio, mask.to(F64), rollout_rs=verl_rs,
                                                         rollout_rs_threshold=threshold)
        _, keep, _ = rollout_correction_weights(old, rollout, mask, mode=mode, threshold=threshold)
        assert torch.equal(keep, verl_mask.bool()), (verl_rs, threshold, keep, verl_mask)
        report[f"{verl_rs} {threshold}"] = int(keep.sum())
    assert len({report["seq_mean_k3 0.1"], report["seq_mean_k3 0.01"]}) == 2, report  # thresholds bite

    # ---- normalisation: verl rollout_is_batch_normalize vs normalize=True ----
    small = 0.4 * torch.randn(N, T, generator=gen, dtype=F64)  # inside +-20: no clamp on either side
    small_ratio = torch.where(mask, small, torch.zeros((), dtype=F64))
    for level, mode in [("token", "tis"), ("sequence", "seq_tis")]:
        verl_w, _ = rc.compute_rollout_correction_weights(small_ratio, mask.to(F64), rollout_is=level,
                                                          rollout_is_threshold=2.0,
                                                          rollout_is_batch_normalize=True)
        ours_w, _, m = rollout_correction_weights(old, old - small, mask, mode=mode, cap=2.0, normalize=True)
        report[f"normalize {level}"] = close(ours_w, verl_w * mask, rtol=1e-7, atol=1e-12)
    verl_w, _ = rc.compute_rollout_correction_weights(small_ratio, mask.to(F64), rollout_is="token",
                                                      rollout_is_threshold="0.8_1.25",
                                                      rollout_is_batch_normalize=True)
    ours_w, keep, _ = rollout_correction_weights(old, old - small, mask, mode="mis", c_low=0.8, c_high=1.25,
                                                 normalize=True)
    assert 0 < int(keep.sum()) < int(mask.sum())
    scale = float(mask.sum()) / float(keep.sum())  # verl divides by a mean over more tokens, zeros included
    report["normalize icepop vs mis"] = close(verl_w * mask, ours_w * scale, rtol=1e-7, atol=1e-12)
    print(json.dumps(report))
    """
)


def test_verl_estimators_rejections_and_normalisation_equal_ours(verl_python, tmp_path):
    report = run_verl_script(verl_python, tmp_path, SCRIPT_PRELUDE + CHECK_SCRIPT)
    assert report["kl k3 clamp difference"][0] == 10.0
    assert report["opo"] < 1e-12
