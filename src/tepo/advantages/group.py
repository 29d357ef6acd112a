"""Sequence-level, group-relative estimators: each response's reward against the other responses to its prompt.

Rewards are ``[N]`` with the ``G`` responses of one prompt in contiguous rows; each estimator returns ``[N]``
and reads no per-token input.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tepo.advantages._common import STD_CONVENTIONS, check_nonnegative, group_std, grouped, zero_variance
from tepo.advantages.registry import register_advantage_estimator


@register_advantage_estimator(
    "grpo", group_relative=True, paper="DeepSeekMath 2402.03300; TEPO 2510.09369 Eq. 5"
)
def grpo_advantages(rewards: Tensor, group_size: int, *, eps: float = 1e-6, std: str = "unbiased") -> Tensor:
    r"""GRPO group-normalised advantage (DeepSeekMath 2402.03300 Sec. 4.1.2; TEPO 2510.09369 Eq. 5).

    .. math:: A_i = \frac{R_i - \operatorname{mean}_g R}{\operatorname{std}_g R + \epsilon}, \quad \epsilon = 10^{-6}

    Reading of "std": neither paper says which. The default ``std="unbiased"`` is the sample standard
    deviation with Bessel's correction, ``sqrt(sum (R_j - mean)^2 / (G - 1))``, as ``torch.std`` computes
    it in verl (``compute_grpo_outcome_advantage``) and TRL's ``GRPOTrainer``, so that our GRPO runs compare
    with theirs; ``std="population"`` divides by ``G`` instead (the convention of the z-scores inside ``erpo``).
    Example, G = 4, R = (1, 0, 0, 0): mean 0.25, unbiased std 0.5, A = (1.5, -0.5, -0.5, -0.5).

    Groups whose rewards are all equal (including every group when G = 1) get exactly 0 — never NaN.
    verl instead uses mean 0 and std 1 when G = 1 (A = R); we follow the group-relative definition, in which a
    lone response has no baseline to beat.
    """
    if std not in STD_CONVENTIONS:
        raise ValueError(f"grpo option std must be 'unbiased' or 'population', got {std!r}")
    check_nonnegative("grpo", "eps", eps)
    if group_size == 1:
        return torch.zeros_like(rewards)
    groups = grouped(rewards, group_size)
    centred = groups - groups.mean(dim=1, keepdim=True)
    adv = centred / (group_std(centred, group_size, std) + eps)
    return torch.where(zero_variance(groups), 0.0, adv).flatten()


@register_advantage_estimator("dr_grpo", group_relative=True, paper="Dr. GRPO 2503.20783")
def dr_grpo_advantages(rewards: Tensor, group_size: int) -> Tensor:
    r"""Dr. GRPO advantage (Liu et al. 2503.20783, "Understanding R1-Zero-Like Training", Sec. 3.2).

    .. math:: A_i = R_i - \operatorname{mean}_g R

    The std normalisation of GRPO is dropped (it up-weights groups of low reward variance, a question-level
    difficulty bias), so no std convention arises. Example, R = (1, 0, 0, 0): A = (0.75, -0.25, -0.25, -0.25).
    All-equal groups give 0.
    """
    groups = grouped(rewards, group_size)
    adv = groups - groups.mean(dim=1, keepdim=True)
    return torch.where(zero_variance(groups), 0.0, adv).flatten()


@register_advantage_estimator(
    "rloo", group_relative=True, paper="RLOO, Kool et al. 2019; Ahmadian et al. 2402.14740"
)
def rloo_advantages(rewards: Tensor, group_size: int) -> Tensor:
    r"""REINFORCE leave-one-out advantage (Kool et al. 2019; Ahmadian et al. 2402.14740 Eq. 4).

    .. math:: A_i = R_i - \frac{1}{G - 1} \sum_{j \ne i} R_j = \frac{G}{G - 1} (R_i - \operatorname{mean}_g R)

    No std normalisation, so no std convention arises. Example, R = (1, 0, 0, 0): A_1 = 1 - 0 = 1,
    A_2 = 0 - 1/3 = -1/3 (twice more). With G = 1 there are no other samples to form a baseline: A = 0 (not NaN).
    All-equal groups give 0.
    """
    if group_size == 1:
        return torch.zeros_like(rewards)
    groups = grouped(rewards, group_size)
    others_mean = (groups.sum(dim=1, keepdim=True) - groups) / (group_size - 1)
    adv = groups - others_mean
    return torch.where(zero_variance(groups), 0.0, adv).flatten()
