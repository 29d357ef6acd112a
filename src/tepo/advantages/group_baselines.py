"""Sequence-level, group-relative estimators of "The 2026 objectives" (docs/algorithms.md): the GRPO baseline
with a batch-wide std (Lite-PPO), MaxRL's mean-normalised advantage and OPO's length-weighted baseline.

Like `tepo.advantages.group`: rewards ``[N]`` with the ``G`` responses of one prompt in contiguous rows, result
``[N]``; groups whose rewards are all equal (and every group when ``G = 1``) get exactly 0. Registered after the
token-level estimators so that the registry lists the TEPO papers' estimators first.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tepo.advantages._common import (
    STD_CONVENTIONS,
    check_nonnegative,
    group_std,
    grouped,
    token_mask,
    zero_variance,
)
from tepo.advantages.registry import register_advantage_estimator


@register_advantage_estimator(
    "grpo_batch_std", group_relative=True, paper="Lite-PPO 2508.08221; TRL scale_rewards='batch'"
)
def grpo_batch_std_advantages(
    rewards: Tensor, group_size: int, *, eps: float = 1e-6, std: str = "unbiased"
) -> Tensor:
    r"""Group-centred, batch-scaled advantage (Lite-PPO, Liu et al. 2508.08221 "group mean, batch std").

    .. math:: A_i = \frac{R_i - \operatorname{mean}_g R}{\operatorname{std}_{batch} R + \epsilon},
              \quad \epsilon = 10^{-6}

    The baseline is the prompt's group mean, as in ``grpo``; the scale is the std of all N rewards of the batch
    (the whole rollout batch the trainer scores at once, after dynamic sampling), so an easy prompt's small
    spread is not blown up to unit scale. ``std="unbiased"`` (the default, Bessel's correction over the N
    rewards) is what TRL's ``scale_rewards="batch"`` computes (``nanstd``); TRL adds ``1e-4`` where we add
    ``eps = 1e-6`` as ``grpo`` does (set ``eps=1e-4`` to match it). Example, two groups of G = 2, R = (1, 0, 1, 1):
    group means 0.5 and 1, batch std sqrt(0.75/3) = 0.5, A = (1, -1, 0, 0). All-equal groups give 0.
    """
    if std not in STD_CONVENTIONS:
        raise ValueError(f"grpo_batch_std option std must be 'unbiased' or 'population', got {std!r}")
    check_nonnegative("grpo_batch_std", "eps", eps)
    if group_size == 1:
        return torch.zeros_like(rewards)
    groups = grouped(rewards, group_size)
    centred = groups - groups.mean(dim=1, keepdim=True)
    flat = rewards.view(1, -1)
    batch_std = group_std(flat - flat.mean(), rewards.shape[0], std)  # [1, 1]
    adv = centred / (batch_std + eps)
    return torch.where(zero_variance(groups), 0.0, adv).flatten()


@register_advantage_estimator(
    "maxrl", group_relative=True, nonnegative_rewards=True, paper="MaxRL 2602.02710"
)
def maxrl_advantages(rewards: Tensor, group_size: int, *, eps: float = 1e-6) -> Tensor:
    r"""Maximum Likelihood RL advantage (Tajwar et al. 2602.02710): the group baseline divided by the mean.

    .. math:: A_i = \frac{R_i - \operatorname{mean}_g R}{\operatorname{mean}_g R + \epsilon}, \quad \epsilon = 10^{-6}

    With pass/fail rewards, ``mean_g R`` is the prompt's estimated success rate ``p``: dividing by it turns the
    expected-reward gradient ``grad p`` into the likelihood gradient ``grad log p = grad p / p``, so hard prompts
    (small ``p``) weigh more. Example, R = (1, 0, 0, 0): p = 0.25, A = (3, -1, -1, -1) (up to eps). A group whose
    mean is 0 (nothing solved) gets 0, as do all-equal groups. The division assumes a success rate: rewards
    must be >= 0 (a negative mean would flip the sign of every advantage of its group), else ValueError.
    """
    check_nonnegative("maxrl", "eps", eps)
    if bool((rewards < 0).any()):
        rows = (rewards < 0).nonzero().flatten().tolist()
        raise ValueError(
            "maxrl divides by the group's mean reward (a success rate), so rewards must be >= 0; "
            f"negative at rows {rows[:10]}{' ...' if len(rows) > 10 else ''}"
        )
    if group_size == 1:
        return torch.zeros_like(rewards)
    groups = grouped(rewards, group_size)
    mean = groups.mean(dim=1, keepdim=True)
    adv = (groups - mean) / (mean + eps)
    return torch.where(zero_variance(groups) | (mean == 0), 0.0, adv).flatten()


@register_advantage_estimator(
    "opo", requires=("mask",), group_relative=True, paper="OPO 2505.23585; verl adv_estimator=opo"
)
def opo_advantages(rewards: Tensor, group_size: int, *, mask: Tensor | None = None) -> Tensor:
    r"""On-Policy RL with Optimal reward baseline (Hao et al. 2505.23585), as verl's ``opo`` estimator.

    .. math:: A_i = R_i - \frac{\sum_{j \in g} |o_j| R_j}{\sum_{j \in g} |o_j|}

    The baseline weights each response's reward by its length ``|o_j|`` (the number of response tokens, read
    from ``mask`` ``[N, T]``: ``|o_j| = sum_t mask[j, t]``, as verl's ``response_mask.sum(-1)``): the
    variance-minimising baseline when the gradient norm grows with length. Example, R = (1, 0), lengths (1, 3):
    baseline 1/4, A = (0.75, -0.25). A group whose responses are all empty (no token to weigh) falls back to
    the plain mean. With G = 1 verl uses baseline 0 (A = R); we give 0, the group-relative reading of ``grpo``.
    All-equal groups give 0.
    """
    if mask is None:
        raise ValueError(
            "advantage estimator 'opo' needs mask=[N, T] (the response lengths) but it was not given"
        )
    m = token_mask("opo", mask, rewards.shape[0])
    if group_size == 1:
        return torch.zeros_like(rewards)
    groups = grouped(rewards, group_size)
    lengths = grouped(m.sum(dim=1).to(rewards.dtype), group_size)
    total = lengths.sum(dim=1, keepdim=True)
    weighted = (lengths * groups).sum(dim=1, keepdim=True) / total.clamp(min=1)
    baseline = torch.where(total > 0, weighted, groups.mean(dim=1, keepdim=True))
    adv = groups - baseline
    return torch.where(zero_variance(groups), 0.0, adv).flatten()
