"""Token-level estimators: a sequence-level base advantage reshaped token by token from per-token signals.

Each returns ``[N, T]`` with exact zeros at masked positions, whatever the inputs hold there (NaN / inf padding
is fine). The base estimator's own needs are part of the declaration, so a base that reads a tensor gets it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from tepo.advantages._common import check_nonnegative, token_input, token_mask
from tepo.advantages.registry import register_advantage_estimator
from tepo.advantages.token_shared import base_advantages, base_requires, masked_zscore, positional_buckets

# --------------------------------------------------------------------------------------------------------
# entropy_adv
# --------------------------------------------------------------------------------------------------------


def _entropy_adv_requires(options: Mapping[str, Any]) -> frozenset[str]:
    return frozenset({"entropy", "mask"}) | base_requires(
        "entropy_adv", options["base"], options["base_options"]
    )


@register_advantage_estimator(
    "entropy_adv",
    requires=_entropy_adv_requires,
    group_relative=True,
    token_level=True,
    paper="Cheng et al. 2506.14758; TEPO 2510.09369 Table 1",
)
def entropy_advantages(
    rewards: Tensor,
    group_size: int,
    *,
    entropy: Tensor | None = None,
    mask: Tensor | None = None,
    logp: Tensor | None = None,
    old_logp: Tensor | None = None,
    ref_logp: Tensor | None = None,
    alpha: float = 4e-4,
    kappa: float = 2.0,
    base: str = "grpo",
    base_options: dict | None = None,
) -> Tensor:
    r"""Entropy-based advantage shaping (Cheng et al. 2506.14758; TEPO 2510.09369 Table 1 "Entropy-based Term").

    .. math:: A_{i,t} = A_i + \min\!\big(\alpha\, \mathrm{sg}[H_{i,t}],\ |A_i| / \kappa\big)

    ``A_i`` comes from the sequence-level ``base`` estimator (default ``grpo``, options in ``base_options``, so
    its std convention is the base's: unbiased for the default grpo); ``H_{i,t}`` is the policy's token entropy
    (``entropy`` ``[N, T]``), stop-gradient. The bonus is clipped at ``|A_i| / kappa`` so it never flips the sign
    of a negative advantage (for ``kappa >= 1``) and vanishes when ``A_i = 0``. Defaults alpha = 4e-4,
    kappa = 2 are the values TEPO Sec. 4.1 states for this baseline. Reads ``entropy`` and ``mask`` (plus
    whatever the base reads: ``logp``/``old_logp``/``ref_logp`` are only passed on to it).

    Example: A_i = 1.5, H = (0, 1000), alpha 4e-4, kappa 2 -> bonus (0, min(0.4, 0.75)) -> A = (1.5, 1.9).
    Masked positions are exactly 0 whatever ``entropy`` holds there (NaN / inf padding is fine).
    """
    check_nonnegative("entropy_adv", "alpha", alpha)
    if isinstance(kappa, bool) or not isinstance(kappa, (int, float)) or not kappa > 0:
        raise ValueError(f"entropy_adv option kappa must be a number > 0, got {kappa!r}")
    m = token_mask("entropy_adv", mask, rewards.shape[0])
    h = token_input("entropy_adv", "entropy", entropy, m)
    passed = {"logp": logp, "old_logp": old_logp, "ref_logp": ref_logp, "mask": mask, "entropy": entropy}
    a = base_advantages("entropy_adv", base, base_options, rewards, group_size, **passed).unsqueeze(1)
    bonus = torch.minimum(alpha * h, a.abs() / kappa)
    return torch.where(m, a + bonus, 0.0)


# --------------------------------------------------------------------------------------------------------
# erpo
# --------------------------------------------------------------------------------------------------------

_ERPO_GATES = ("relu", "hard", "none")
# progress_baseline -> the tensor the progress signal d = logp - <baseline> is measured against.
_ERPO_BASELINES = {"ref": "ref_logp", "old": "old_logp"}


def _erpo_baseline_input(progress_baseline: Any) -> str:
    if not isinstance(progress_baseline, str) or progress_baseline not in _ERPO_BASELINES:
        raise ValueError(
            f"erpo option progress_baseline must be one of {tuple(_ERPO_BASELINES)}, got {progress_baseline!r}"
        )
    return _ERPO_BASELINES[progress_baseline]


def _erpo_requires(options: Mapping[str, Any]) -> frozenset[str]:
    own = {"entropy", "mask", "logp", _erpo_baseline_input(options["progress_baseline"])}
    return frozenset(own) | base_requires("erpo", options["base"], options["base_options"])


def _check_erpo_options(gate, num_buckets, lam, gate_threshold, eps) -> None:
    if gate not in _ERPO_GATES:
        raise ValueError(f"erpo option gate must be one of {_ERPO_GATES}, got {gate!r}")
    if isinstance(num_buckets, bool) or not isinstance(num_buckets, int) or num_buckets < 1:
        raise ValueError(f"erpo option num_buckets must be a positive int, got {num_buckets!r}")
    if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not math.isfinite(lam):
        raise ValueError(f"erpo option lam must be a finite number, got {lam!r}")
    if isinstance(gate_threshold, bool) or not isinstance(gate_threshold, (int, float)):
        raise ValueError(f"erpo option gate_threshold must be a number, got {gate_threshold!r}")
    check_nonnegative("erpo", "eps", eps)


def _gated_entropy(
    h: Tensor, m: Tensor, group_size: int, gate: str, gate_threshold: float, eps: float
) -> Tensor:
    """ERPO's ``H^n`` ``[N, T]``: the entropy z-scored over every valid token of the group, then the gate."""
    n, seq_len = m.shape
    num_groups = n // group_size
    z = masked_zscore(h.view(num_groups, -1), m.view(num_groups, -1), eps).view(n, seq_len)
    if gate == "relu":
        hn = (z - gate_threshold).clamp(min=0)
    elif gate == "hard":
        hn = (z > gate_threshold).to(z.dtype)
    else:
        hn = z
    return torch.where(m, hn, 0.0)


def _bucket_progress(d: Tensor, m: Tensor, group_size: int, num_buckets: int, eps: float) -> Tensor:
    """ERPO's ``S^n`` ``[N, T]``: the mean of ``d`` over each response's positional buckets, z-scored bucket by
    bucket across the group's responses that reach it, and every token given its bucket's value."""
    n = d.shape[0]
    num_groups = n // group_size
    bucket = positional_buckets(m, num_buckets).clamp(0, num_buckets - 1)
    bucket = torch.where(m, bucket, 0)
    onehot = torch.nn.functional.one_hot(bucket, num_buckets).to(d.dtype) * m.unsqueeze(-1)  # [N, T, K]
    bucket_count = onehot.sum(dim=1)  # [N, K]
    bucket_mean = (onehot * d.unsqueeze(-1)).sum(dim=1) / bucket_count.clamp(min=1)
    present = bucket_count > 0
    # Z-score across the G responses of each group, bucket by bucket: rows (group, bucket), columns responses.
    sbar = bucket_mean.view(num_groups, group_size, num_buckets).transpose(1, 2).reshape(-1, group_size)
    pres = present.view(num_groups, group_size, num_buckets).transpose(1, 2).reshape(-1, group_size)
    sn_bucket = (
        masked_zscore(sbar, pres, eps)
        .view(num_groups, num_buckets, group_size)
        .transpose(1, 2)
        .reshape(n, num_buckets)
    )
    return torch.gather(sn_bucket, 1, bucket)


@register_advantage_estimator(
    "erpo",
    requires=_erpo_requires,
    group_relative=True,
    token_level=True,
    paper="ERPO 2603.28204 (reading from abstract)",
)
def erpo_advantages(
    rewards: Tensor,
    group_size: int,
    *,
    entropy: Tensor | None = None,
    mask: Tensor | None = None,
    logp: Tensor | None = None,
    ref_logp: Tensor | None = None,
    old_logp: Tensor | None = None,
    lam: float = 0.1,
    num_buckets: int = 4,
    gate: str = "relu",
    gate_threshold: float = 0.0,
    progress_baseline: str = "ref",
    eps: float = 1e-6,
    base: str = "grpo",
    base_options: dict | None = None,
) -> Tensor:
    r"""Entropy-Regulated Policy Optimization token advantage (ERPO, 2603.28204). OUR READING.

    Only the abstract and figure captions of ERPO are public (Fig. 2: ``Â = H ⊙ S ⊙ sgn(A)`` merged with the
    sequence-level baseline). This implements the reading written down in docs/algorithms.md#erpo:

    .. math:: A_{i,t} = A_i + \lambda \, H^n_{i,t} \, S^n_{i,t} \, \operatorname{sgn}(A_i)

    * ``A_i``: sequence-level ``base`` estimator (default ``grpo``); ``sgn(0) = 0``, so groups with no reward
      spread get no token signal ("result-anchored").
    * ``H^n`` (entropy-aware gating): ``z = (H - mean) / (std + eps)`` over all valid tokens of the G responses
      of the prompt (population std), then the gate: ``relu`` -> ``max(z - tau, 0)`` (default, tau = 0: only
      above-average-entropy tokens, the "critical decision pivots", are amplified); ``hard`` -> ``1[z > tau]``;
      ``none`` -> ``z``. ``tau`` = ``gate_threshold``.
    * ``S^n`` (bucket-based implicit normalisation): the implicit progress signal ``d = logp - ref_logp``
      (``progress_baseline="ref"``, default) or ``logp - old_logp`` (``"old"``). Valid token ``t`` of response
      ``i`` (0-based index ``p`` among its ``L_i`` valid tokens) falls in bucket ``b = floor(K p / L_i)``
      (K = ``num_buckets``). ``S̄[i, b]`` = mean of ``d`` over the bucket; then for each bucket,
      ``S^n[i, b]`` = z-score of ``S̄[., b]`` over the responses of the group that have tokens in that bucket
      (population std; 0 when fewer than two do or they are all equal). Every token takes its bucket's value.

    When the progress signal is 0. ``S^n`` is 0 wherever ``d`` is the same for every response, and then
    ``A_{i,t} = A_i``: ERPO reduces to its base. With ``"old"``, a trainer that computes advantages once per
    rollout before updating (the built-in one) has ``logp == old_logp``, so ``d = 0`` at every step; config
    validation refuses that combination. With ``"ref"``, ``d = 0`` on the first step (the reference is a copy
    of the initial policy) and becomes informative as the policy moves away from it; note that the z-score
    makes ``S^n`` unit-scale as soon as ``d`` differs at all between responses, however small ``d`` is.

    Std conventions. Both z-scores divide by the pool size (population std), unlike the default ``grpo`` base
    (unbiased, to match TRL and verl): the pools here vary in size (a group's valid tokens; the responses that
    reach a bucket, often just 2) and the z-score is a weight, not a reward scale, so it should have unit mean
    square over its pool whatever the pool's size (``sum z^2 = n``); with Bessel's correction a pair of
    responses would get ``±1/sqrt(2)`` instead of ``±1``. docs/algorithms.md fixes this reading. ``A_i`` keeps the
    base's convention (set ``base_options={"std": "population"}`` for population throughout).

    Defaults lam = 0.1, K = 4, gate relu at 0 are ours (the paper's values are not public).
    Reads ``entropy``, ``mask``, ``logp`` and ``ref_logp`` (``"ref"``) or ``old_logp`` (``"old"``), all
    ``[N, T]``. Masked positions are exactly 0 and never NaN, whatever the inputs hold there.
    """
    _check_erpo_options(gate, num_buckets, lam, gate_threshold, eps)
    baseline_label = _erpo_baseline_input(progress_baseline)

    n = rewards.shape[0]
    m = token_mask("erpo", mask, n)
    h = token_input("erpo", "entropy", entropy, m)
    lp = token_input("erpo", "logp", logp, m)
    baseline = {"ref_logp": ref_logp, "old_logp": old_logp}[baseline_label]
    base_lp = token_input("erpo", baseline_label, baseline, m)
    passed = {"logp": logp, "old_logp": old_logp, "ref_logp": ref_logp, "mask": mask, "entropy": entropy}
    a = base_advantages("erpo", base, base_options, rewards, group_size, **passed)

    hn = _gated_entropy(h, m, group_size, gate, gate_threshold, eps)
    # Progress signal: bucket means of d per response, z-scored per bucket across the group.
    sn = _bucket_progress(lp - base_lp, m, group_size, num_buckets, eps)
    adv = a.unsqueeze(1) + lam * hn * sn * torch.sign(a).unsqueeze(1)
    return torch.where(m, adv, 0.0)
