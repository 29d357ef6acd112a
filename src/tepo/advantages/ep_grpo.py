"""EP-GRPO (Entropy-Progress Aligned GRPO, arXiv 2605.04960): token advantages gated by entropy, with an implicit
progress term that keeps a gradient in groups whose rewards are all equal. OUR READING (docs/algorithms.md#ep_grpo).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from tepo.advantages._common import check_nonnegative, grouped, token_input, token_mask, zero_variance
from tepo.advantages.registry import register_advantage_estimator
from tepo.advantages.token_shared import base_advantages, base_requires, masked_zscore, positional_buckets

# The z-scores' denominators are std + _Z_EPS ("+ 1e-6", docs/algorithms.md#ep_grpo); not an option.
_Z_EPS = 1e-6
# A response whose summed entropy is at most this has no entropy to measure progress by: positional buckets.
_NO_ENTROPY = 1e-12


def _check_options(gamma, eta, num_buckets, theta_reward, std_floor) -> None:
    for name, value in (("gamma", gamma), ("eta", eta)):
        check_nonnegative("ep_grpo", name, value)
        if not math.isfinite(value):
            raise ValueError(f"ep_grpo option {name} must be a finite number >= 0, got {value!r}")
    if isinstance(num_buckets, bool) or not isinstance(num_buckets, int) or num_buckets < 1:
        raise ValueError(f"ep_grpo option num_buckets must be a positive int, got {num_buckets!r}")
    if (
        isinstance(theta_reward, bool)
        or not isinstance(theta_reward, (int, float))
        or not math.isfinite(theta_reward)
    ):
        raise ValueError(f"ep_grpo option theta_reward must be a finite number, got {theta_reward!r}")
    check_nonnegative("ep_grpo", "std_floor", std_floor)


def _ep_grpo_requires(options: Mapping[str, Any]) -> frozenset[str]:
    own = {"entropy", "old_logp", "ref_logp", "mask"}
    return frozenset(own) | base_requires("ep_grpo", options["base"], options["base_options"])


def entropy_gate(h: Tensor, m: Tensor, group_size: int, gamma: float) -> Tensor:
    """``W = sigmoid(gamma * z)``, ``z`` the entropy's z-score over every valid token of the group (population
    std, denominator ``std + 1e-6``). A group with one valid token, or whose tokens all have the same entropy,
    has ``z = 0`` (``W = 1/2``) exactly rather than a rounding residue divided by 1e-6. ``[N, T]``, 0 on padding."""
    n, seq_len = m.shape
    z = masked_zscore(h.view(n // group_size, -1), m.view(n // group_size, -1), _Z_EPS).view(n, seq_len)
    return torch.where(m, torch.sigmoid(gamma * z), 0.0)


def polarity(rewards: Tensor, base: Tensor, group_size: int, theta_reward: float) -> Tensor:
    """``d_i = sign(A_i)``, or ``sign(R_i - theta_reward)`` where the group's rewards are all exactly equal (the
    zero-variance fallback: with binary rewards and theta 0.5 an all-correct group gets +1, all-wrong -1). ``[N]``."""
    all_equal = zero_variance(grouped(rewards, group_size)).expand(-1, group_size).reshape(-1)
    return torch.where(all_equal, torch.sign(rewards.to(base.dtype) - theta_reward), torch.sign(base))


def progress_buckets(h: Tensor, m: Tensor, num_buckets: int) -> Tensor:
    """The bucket ``b[i, t]`` in ``0 .. K-1`` of each valid token along its response's cumulative entropy.

    ``C[i,t] = sum_{t'<t} m H`` (the entropy *before* the token), ``S_i = sum_t m H``;
    ``b = min(floor(K C / S_i), K - 1)``. A response with ``S_i <= 1e-12`` (no entropy at all) takes the positional
    bucket ``(K p) // L_i`` in integers, ``p`` the 0-based index among its ``L_i`` valid tokens. Padding: 0."""
    hm = torch.where(m, h, 0.0)
    total = hm.sum(dim=1, keepdim=True)
    before = torch.cumsum(hm, dim=1) - hm  # exclusive cumulative sum
    by_entropy = torch.floor(num_buckets * before / torch.where(total > _NO_ENTROPY, total, 1.0)).long()
    by_position = positional_buckets(m, num_buckets)
    bucket = torch.where(total > _NO_ENTROPY, by_entropy, by_position).clamp(0, num_buckets - 1)
    return torch.where(m, bucket, 0)


def bucket_normalised_progress(
    s: Tensor, m: Tensor, bucket: Tensor, group_size: int, num_buckets: int, std_floor: float
) -> Tensor:
    """``s~``: ``s`` z-scored over the pool of valid tokens that one group has in one bucket, across its G
    responses (population std, denominator ``std + 1e-6``); 0 in a pool of fewer than 2 tokens or whose std is
    at most ``std_floor``. ``[N, T]``, 0 on padding."""
    n, seq_len = s.shape
    group = torch.arange(n, device=s.device).div(group_size, rounding_mode="floor").unsqueeze(1)
    pool = torch.where(m, group * num_buckets + bucket, 0).reshape(-1)
    weight = m.reshape(-1).to(s.dtype)
    values = torch.where(m, s, 0.0).reshape(-1)
    num_pools = (n // group_size) * num_buckets
    count = torch.zeros(num_pools, dtype=s.dtype, device=s.device).index_add_(0, pool, weight)
    mean = torch.zeros_like(count).index_add_(0, pool, values) / count.clamp(min=1)
    centred = (values - mean[pool]) * weight
    std = (torch.zeros_like(count).index_add_(0, pool, centred.square()) / count.clamp(min=1)).sqrt()
    usable = (count >= 2) & (std > std_floor)
    z = torch.where(usable[pool], centred / (std[pool] + _Z_EPS), 0.0).view(n, seq_len)
    return torch.where(m, z, 0.0)


@register_advantage_estimator(
    "ep_grpo",
    requires=_ep_grpo_requires,
    group_relative=True,
    token_level=True,
    paper="EP-GRPO 2605.04960 (our reading: docs/algorithms.md)",
)
def ep_grpo_advantages(
    rewards: Tensor,
    group_size: int,
    *,
    entropy: Tensor | None = None,
    mask: Tensor | None = None,
    logp: Tensor | None = None,
    old_logp: Tensor | None = None,
    ref_logp: Tensor | None = None,
    gamma: float = 5.0,
    eta: float = 0.2,
    num_buckets: int = 10,
    theta_reward: float = 0.5,
    std_floor: float = 1e-6,
    base: str = "grpo",
    base_options: dict | None = None,
) -> Tensor:
    r"""Entropy-Progress Aligned GRPO token advantage (EP-GRPO, 2605.04960). OUR READING.

    The method section is not public; the project fixes a reading of every part, and docs/algorithms.md#ep_grpo
    lists the open points and the choices. For each group of G responses:

    .. math::

        A_{i,t} = m_{i,t}\, W_{i,t}\, \big(A_i + \eta\, d_i\, \tilde s_{i,t}\big), \qquad
        W_{i,t} = \sigma\!\big(\gamma\, (H_{i,t} - \mu_g) / (\sigma_g + 10^{-6})\big)

    * ``A_i``: the sequence-level ``base`` estimator (default ``grpo``, its own std convention, options in
      ``base_options``).
    * ``W`` (entropy gate): ``mu_g``, ``sigma_g`` mean and population std of ``H`` over every valid token of the
      group; ``H`` is the sampling policy's token entropy.
    * ``d_i`` (polarity): ``sign(A_i)``; where the group's rewards are all equal (GRPO's zero-variance groups,
      whose ``A_i = 0``) ``sign(R_i - theta_reward)``, so an all-correct group is pushed up, an all-wrong one down.
    * ``s~`` (progress): ``s = old_logp - ref_logp`` (how far the sampling policy moved from the reference at the
      token), bucketed by cumulative entropy before the token (``b = min(floor(K C/S), K-1)``; positional buckets
      when a response has no entropy), then z-scored per bucket over the group's tokens in it (population std;
      0 where a bucket holds fewer than 2 tokens or its std is at most ``std_floor``).

    With ``old == ref`` (the first step, or LoRA with a fresh adapter) ``s~ = 0`` and EP-GRPO is the base
    advantage with gated tokens; an all-equal group then gets 0. Defaults (ours): gamma 5, eta 0.2, K 10,
    theta_reward 0.5, std_floor 1e-6. Reads ``entropy``, ``old_logp``, ``ref_logp``, ``mask`` (``[N, T]``, all
    detached; ``logp`` only reaches the base). Masked positions are exactly 0, whatever the inputs hold there.

    Example (G = 2, one token each, gamma 0): rewards (1, 1) -> all equal, ``A_i = 0``, ``d = (+1, +1)``;
    ``s = (0.2, -0.2)`` in one bucket -> ``s~ ~= (1, -1)``; ``A = 0.5 * 0.2 * (1, -1) = (0.1, -0.1)``.
    """
    _check_options(gamma, eta, num_buckets, theta_reward, std_floor)
    n = rewards.shape[0]
    m = token_mask("ep_grpo", mask, n)
    # Float64 copies, 0 on padding. Entropy is >= 0 in exact arithmetic; a rounding residue below 0 (a nearly
    # certain token) would put a cumulative sum out of order, so it counts as 0.
    h = token_input("ep_grpo", "entropy", entropy, m).clamp(min=0)
    old = token_input("ep_grpo", "old_logp", old_logp, m)
    ref = token_input("ep_grpo", "ref_logp", ref_logp, m)
    passed = {"logp": logp, "old_logp": old_logp, "ref_logp": ref_logp, "mask": mask, "entropy": entropy}
    a = base_advantages("ep_grpo", base, base_options, rewards, group_size, **passed)

    gate = entropy_gate(h, m, group_size, gamma)
    d = polarity(rewards, a, group_size, theta_reward)
    bucket = progress_buckets(h, m, num_buckets)
    s_tilde = bucket_normalised_progress(old - ref, m, bucket, group_size, num_buckets, std_floor)
    adv = gate * (a.unsqueeze(1) + eta * d.unsqueeze(1) * s_tilde)
    return torch.where(m, adv, 0.0)
