"""CoDaPO (arXiv 2606.07950): GRPO advantages scaled by each group's confidence-weighted learnability.

From the open pull request verl #7497 (head ``cb85d41a7addd723dac0d65899fb8e7386b09af8``,
``compute_codapo_outcome_advantage``). Its second half, CoDaSampling (a focused second optimizer step on the
top-K prompts by value, rolled out again), is a trainer feature tepo's step does not have: the option that would
ask for it is refused.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tepo.advantages._common import check_nonnegative, grouped, zero_variance
from tepo.advantages.registry import register_advantage_estimator

# A row is correct when its reward is within this of ``correct_reward`` (verl: |acc - 1| <= 1e-6).
_CORRECT_TOL = 1e-6


def grpo_outcome(rewards: Tensor, group_size: int, eps: float, norm_by_std: bool) -> Tensor:
    """verl's GRPO outcome advantage per row [N]: a group of one has mean 0 and std 1 (``A = R / (1 + eps)``),
    larger groups their mean and unbiased std; all-equal groups exactly 0."""
    groups = grouped(rewards, group_size)
    if group_size == 1:
        centred, std = groups, torch.ones_like(groups)
    else:
        centred = groups - groups.mean(dim=1, keepdim=True)
        std = groups.std(dim=1, keepdim=True)
        centred = torch.where(zero_variance(groups), 0.0, centred)
    adv = centred / (std + eps) if norm_by_std else centred
    return adv.flatten()


def codapo_values(
    rewards: Tensor, group_size: int, old_logp: Tensor, mask: Tensor, correct_reward: float = 1.0
) -> Tensor:
    """Per group [num_groups]: ``v_g = c_g * 4 acc_g (1 - acc_g)`` over the group's non-empty rows, with
    ``c_g = exp(mean_i (sum_t m old / L_i))`` (confidence) and ``acc_g`` the share of correct rows; 0 for a
    group without a non-empty row."""
    valid = mask.bool()
    lengths = valid.sum(dim=-1)
    nonempty = (lengths > 0).to(torch.float64)
    mean_logp = torch.where(valid, old_logp.to(torch.float64), 0.0).sum(dim=-1) / lengths.clamp(min=1)
    correct = ((rewards - correct_reward).abs() <= _CORRECT_TOL).to(torch.float64) * nonempty
    rows = grouped(nonempty, group_size).sum(dim=1).clamp(min=1)
    acc = grouped(correct, group_size).sum(dim=1) / rows
    confidence = torch.exp(grouped(mean_logp * nonempty, group_size).sum(dim=1) / rows)
    return confidence * 4.0 * acc * (1.0 - acc)


@register_advantage_estimator(
    "codapo",
    requires=("old_logp", "mask"),
    group_relative=True,
    token_level=True,
    paper="CoDaPO 2606.07950 (open PR: verl #7497 @cb85d41a)",
)
def codapo_advantages(
    rewards: Tensor,
    group_size: int,
    *,
    old_logp: Tensor | None = None,
    mask: Tensor | None = None,
    delta: float = 0.1,
    eps: float = 1e-6,
    norm_by_std: bool = True,
    correct_reward: float = 1.0,
    focused_step: bool = False,
) -> Tensor:
    r"""CoDaPO advantage: A[i,t] = A^GRPO_i * (v_g + delta) * m[i,t], v_g = c_g * 4 acc_g (1 - acc_g).

    CoDaPO (arXiv 2606.07950), as verl #7497 computes it. ``A^GRPO`` is verl's outcome advantage
    (``(R - mean_g) / (std_g + eps)``, unbiased std; ``R - mean_g`` with ``norm_by_std=False``; a group of one has
    mean 0 and std 1). Over the group's rows with at least one valid token: ``acc_g`` = share of correct rows
    (reward within 1e-6 of ``correct_reward``: verl reads the reward's ``acc`` field, which is the reward itself
    for a 0/1 verifier), ``c_g = exp(mean_i mean_t old_logp)`` (the old policy's confidence). ``v_g`` peaks at
    ``acc = 1/2`` and is 0 for all-correct and all-wrong groups; ``delta`` (>= 0) keeps every group's gradient
    alive. Example, G = 2, R = (1, 0), mean old log-prob -ln 2 per row: c = 1/2, acc = 1/2, v = 1/2, A^GRPO =
    (1/sqrt(2), -1/sqrt(2)) / (1 + eps-ish), so A = (0.6 / sqrt(2), -0.6 / sqrt(2)) per valid token.

    ``focused_step=True`` (CoDaSampling: a second optimizer step on the top-K prompts by v, rolled out again) is
    refused: it needs a second rollout inside one training step, which tepo's step plan does not have.
    """
    if focused_step:
        raise ValueError(
            "codapo option focused_step: CoDaSampling (verl #7497's focused second step, a new rollout of the "
            "top-K prompts by value inside one training step) is not offered by tepo's trainer; use the "
            "estimator alone (focused_step=false)"
        )
    check_nonnegative("codapo", "delta", delta)
    check_nonnegative("codapo", "eps", eps)
    values = codapo_values(rewards, group_size, old_logp, mask, correct_reward)
    scale = grpo_outcome(rewards, group_size, eps, bool(norm_by_std)) * (values + delta).repeat_interleave(
        group_size
    )
    return scale.unsqueeze(-1) * mask.to(torch.float64)
