"""verl's other estimators (#39): closed-form values on hand-checkable tensors, and the refusal of remax.

Parity with verl's real functions is in tests/integrations/test_integration_verl_framework_estimators.py (slow, .venv-verl).
"""

from __future__ import annotations

import math

import pytest
import torch

from tepo.advantages import compute_advantages, estimator_requires
from tepo.advantages.frameworks import masked_whiten

F64 = torch.float64


def t(*values):
    return torch.tensor(values, dtype=F64)


def test_reinforce_plus_plus_whitens_returns_over_tokens():
    # R = (1, 0), one token each: mean 0.5, unbiased var 0.5 -> A = +-0.5/sqrt(0.5 + 1e-8).
    adv = compute_advantages("reinforce_plus_plus", t(1.0, 0.0), 1, mask=torch.ones(2, 1))
    a = 0.5 / math.sqrt(0.5 + 1e-8)
    # rtol 3e-8: verl's masked means divide by (count + 1e-8), a relative 1e-8/count the hand values leave out.
    torch.testing.assert_close(adv, t(a, -a).unsqueeze(-1), rtol=3e-8, atol=0)
    # Token weighting: R = (1, 0) with lengths (3, 1): mean 3/4, var (3*(1/16) + 9/16) / 3 = 1/4.
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    adv = compute_advantages("reinforce_plus_plus", t(1.0, 0.0), 1, mask=mask)
    s = 1 / math.sqrt(0.25 + 1e-8)
    torch.testing.assert_close(
        adv, t(0.25 * s, 0.25 * s, 0.25 * s, -0.75 * s, 0, 0).view(2, 3), rtol=3e-8, atol=1e-15
    )
    # gamma < 1: G = gamma^(tokens after t) * R before whitening.
    adv = compute_advantages("reinforce_plus_plus", t(1.0, 0.0), 1, mask=mask, gamma=0.5)
    g = t(0.25, 0.5, 1.0, 0.0)
    white = (g - g.mean()) / torch.sqrt(g.var() + 1e-8)
    torch.testing.assert_close(adv[mask.bool()], white, rtol=3e-8, atol=1e-15)


def test_reinforce_plus_plus_baseline_by_hand():
    # Groups (1, 0), (1, 1), one token each: centred (0.5, -0.5, 0, 0), mean 0, var 0.5/3 = 1/6.
    adv = compute_advantages("reinforce_plus_plus_baseline", t(1.0, 0.0, 1.0, 1.0), 2, mask=torch.ones(4, 1))
    s = 0.5 / math.sqrt(1 / 6 + 1e-8)
    torch.testing.assert_close(adv, t(s, -s, 0.0, 0.0), rtol=3e-8, atol=1e-15)  # (count + 1e-8), as above
    # Lengths weigh the statistics: the same rewards with lengths (3, 1, 1, 1).
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 0, 0], [1, 0, 0]])
    adv = compute_advantages("reinforce_plus_plus_baseline", t(1.0, 0.0, 1.0, 1.0), 2, mask=mask)
    tokens = t(0.5, 0.5, 0.5, -0.5, 0.0, 0.0)
    mean, std = tokens.mean(), torch.sqrt(tokens.var() + 1e-8)
    torch.testing.assert_close(adv, (t(0.5, -0.5, 0.0, 0.0) - mean) / std, rtol=3e-8, atol=1e-15)


def test_grpo_passk_only_the_best_learns():
    adv = compute_advantages("grpo_passk", t(0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.5), 4)
    # Group 1: margin 1, std 0.5 -> 1/(0.5 + 1e-6) on the best; group 2: tie at the top -> margin 0.
    torch.testing.assert_close(adv, t(0, 1 / (0.5 + 1e-6), 0, 0, 0, 0, 0, 0), rtol=0, atol=1e-12)
    adv = compute_advantages("grpo_passk", t(0.2, 1.0, 0.5), 3, norm_by_std=False)
    torch.testing.assert_close(adv, t(0.0, 0.5, 0.0), rtol=0, atol=1e-15)
    with pytest.raises(ValueError, match="at least 2 samples"):
        compute_advantages("grpo_passk", t(1.0), 1)


def test_gpg_scales_by_share_of_nonzero_rewards():
    # One non-zero reward of 4: alpha = 4; group (1, 0) centred (0.5, -0.5) -> (2, -2); group (0, 0) -> 0.
    torch.testing.assert_close(compute_advantages("gpg", t(1.0, 0.0, 0.0, 0.0), 2), t(2.0, -2.0, 0.0, 0.0))
    torch.testing.assert_close(
        compute_advantages("gpg", t(1.0, 0.0, 1.0, 1.0), 2, f_norm=2.0), t(4 / 3 * 0.25, -4 / 3 * 0.25, 0, 0)
    )


def _otb_case():
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    old = torch.log(t(0.5, 0.25, 1.0, 0.5, 0, 0, 0.5, 0.5, 0, 0.5, 0.5, 0.5).view(4, 3))
    s2 = t(0.5, 0.25, 1.0, 0.5, 0, 0, 0.5, 0.5, 0, 0.5, 0.5, 0.5).view(4, 3)
    return mask, old, s2


def test_optimal_token_baseline_by_hand():
    mask, old, s2 = _otb_case()
    rewards = t(1.0, 0.0, 0.0, 1.0)
    adv = compute_advantages("optimal_token_baseline", rewards, 2, old_logp=old, sum_pi_squared=s2, mask=mask)
    # w = 1 - 2 pi + sum pi^2 = 1 - pi when sum pi^2 = pi: row 0 (0.5, 0.75, 0), row 1 (0.5).
    # W (cumulative): row 0 (0.5, 1.25, 1.25), row 1 (0.5, ., .). Step 0: B = (1*0.5 + 0*0.5) / 1 = 0.5.
    # Steps 1-2: row 0 is strictly the longest (3 > 1): zero tail from column 1, so A = G = 1 there.
    torch.testing.assert_close(adv[0], t(0.5, 1.0, 1.0), rtol=0, atol=1e-7)
    torch.testing.assert_close(adv[1], t(-0.5, 0.0, 0.0), rtol=0, atol=1e-7)
    # Group 2: w row 2 (0.5, 0.5), row 3 (0.5, 0.5, 0.5); W row 2 (0.5, 1.0), row 3 (0.5, 1.0, 1.5).
    # Step 0: B = 0.5; step 1: B = (0*1 + 1*1) / 2 = 0.5; step 2: row 3 longest (3 > 2) -> baseline 0 there.
    torch.testing.assert_close(adv[2], t(-0.5, -0.5, 0.0), rtol=0, atol=1e-7)
    torch.testing.assert_close(adv[3], t(0.5, 0.5, 1.0), rtol=0, atol=1e-7)
    off = compute_advantages(
        "optimal_token_baseline",
        rewards,
        2,
        old_logp=old,
        sum_pi_squared=s2,
        mask=mask,
        handle_zero_tail=False,
    )
    # Without the zero tail, row 0's steps 1-2 have only itself: B = G, A = 0 (up to eps).
    torch.testing.assert_close(off[0, 1:], t(0.0, 0.0), rtol=0, atol=1e-6)
    # On prefix masks the multi-turn variant is the same estimator.
    tir = compute_advantages(
        "tir_optimal_token_baseline", rewards, 2, old_logp=old, sum_pi_squared=s2, mask=mask
    )
    torch.testing.assert_close(tir, adv, rtol=0, atol=1e-15)


def test_tir_packs_valid_tokens_of_multi_turn_responses():
    # Row 0 has an observation gap (mask 1, 0, 1): packed, it is (1, 1) like row 1's prefix.
    mask = torch.tensor([[1, 0, 1], [1, 1, 0]], dtype=torch.bool)
    old = torch.log(torch.full((2, 3), 0.5, dtype=F64))
    s2 = torch.full((2, 3), 0.5, dtype=F64)
    rewards = t(1.0, 0.0)
    tir = compute_advantages(
        "tir_optimal_token_baseline", rewards, 2, old_logp=old, sum_pi_squared=s2, mask=mask
    )
    packed = compute_advantages(
        "optimal_token_baseline",
        rewards,
        2,
        old_logp=old,
        sum_pi_squared=s2,
        mask=torch.tensor([[1, 1, 0]] * 2),
    )
    torch.testing.assert_close(tir[0, [0, 2]], packed[0, :2], rtol=0, atol=1e-15)
    assert float(tir[0, 1]) == 0.0
    flat = compute_advantages(
        "optimal_token_baseline", rewards, 2, old_logp=old, sum_pi_squared=s2, mask=mask
    )
    assert not torch.allclose(
        flat, tir
    )  # column positions differ from packed ones: the two are not one function


def test_declarations_and_refusals():
    assert estimator_requires("optimal_token_baseline") == {"old_logp", "sum_pi_squared", "mask"}
    assert estimator_requires("reinforce_plus_plus") == {"mask"}
    with pytest.raises(ValueError, match="greedy rollout"):
        compute_advantages("remax", t(1.0, 0.0), 2)
    with pytest.raises(ValueError, match="sum_pi_squared"):
        compute_advantages(
            "optimal_token_baseline", t(1.0, 0.0), 2, old_logp=torch.zeros(2, 1), mask=torch.ones(2, 1)
        )
    with pytest.raises(ValueError, match="at least 2 valid tokens"):
        masked_whiten(t(1.0), torch.ones(1))


def test_remax_refused_by_config_in_one_line():
    from tepo.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="'remax' is not offered: ReMax"):
        load_config(overrides=["algorithm.advantage=remax"])


def test_sum_pi_squared_from_the_logprob_pass():
    from helpers import tiny_llama
    from tepo.logprobs import response_logprobs

    model = tiny_llama()
    ids = torch.randint(1, 97, (2, 6))
    att = torch.ones(2, 6, dtype=torch.long)
    att[1, -1] = 0
    with torch.no_grad():
        _, _, s2 = response_logprobs(model, ids, att, 3, compute_sum_pi_squared=True, temperature=0.7)
        probs = torch.softmax(model(input_ids=ids, attention_mask=att).logits[:, 2:5].float() / 0.7, -1)
    expected = probs.square().sum(-1) * att[:, 3:]
    torch.testing.assert_close(s2, expected, rtol=1e-5, atol=1e-6)
    assert bool((s2[att[:, 3:].bool()] > 0).all()) and float(s2[1, 2]) == 0.0
    with pytest.raises(ValueError, match="no-grad"):
        response_logprobs(model, ids, att, 3, compute_sum_pi_squared=True)
