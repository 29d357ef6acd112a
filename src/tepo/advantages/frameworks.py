"""Estimators verl 0.9.1 registers (``register_adv_est``) beyond the GRPO family: REINFORCE++ (with and without a
group baseline), Pass@k training, GPG, the optimal token baseline (single- and multi-turn) and GDPO's
multi-reward normalisation. Each equals verl's function on the same float64 tensors, the settings written in
tests/integrations/test_integration_verl_framework_estimators.py; ``remax`` is refused (see `REFUSED_ESTIMATORS`).

verl's batch whitening (``verl_F.masked_whiten``) is `masked_whiten` here: the mean and the unbiased variance
over every valid token of the batch (a response counts once per token), ``(x - mean) / sqrt(var + 1e-8)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tepo.advantages._common import check_nonnegative, grouped, token_input, token_mask, zero_variance
from tepo.advantages.registry import REFUSED_ESTIMATORS, register_advantage_estimator  # noqa: F401 (re-export)

# Names verl registers that tepo does not, each with the one line saying why (get_advantage_estimator shows it).


def masked_whiten(values: Tensor, mask: Tensor) -> Tensor:
    r"""verl's ``masked_whiten``: :math:`(x - \mu) / \sqrt{\sigma^2 + 10^{-8}}` with the masked mean
    :math:`\mu = \sum m x / (\sum m + 10^{-8})` and the unbiased masked variance (times ``n / (n - 1)``,
    ``n = sum m``); fewer than two valid tokens raise ValueError, as verl does."""
    mean, rstd = _whiten_stats(values, mask)
    return (values - mean) * rstd


def _whiten_stats(values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    m = mask.to(values.dtype)
    count = m.sum()
    if int(count) < 2:
        raise ValueError(f"batch whitening needs at least 2 valid tokens, got {int(count)}")
    mean = (values * m).sum() / (count + 1e-8)
    var = ((values - mean) ** 2 * m).sum() / (count + 1e-8) * (count / (count - 1))
    return mean, torch.rsqrt(var + 1e-8)


def _outcome_returns(rewards: Tensor, mask: Tensor) -> Tensor:
    """Reward-to-go ``[N, T]`` of an outcome reward placed on each response's last valid token (verl's
    ``token_level_rewards``): ``R_i`` on and before that token, 0 after it."""
    m = mask.to(rewards.dtype)
    last = torch.where(mask.any(dim=1), mask.shape[1] - 1 - mask.flip(1).to(torch.int8).argmax(dim=1), 0)
    token_rewards = torch.zeros_like(m)
    token_rewards[torch.arange(m.shape[0], device=m.device), last] = rewards * mask.any(dim=1)
    return (token_rewards * m).flip(-1).cumsum(-1).flip(-1)


@register_advantage_estimator(
    "reinforce_plus_plus",
    requires=("mask",),
    token_level=True,
    paper="REINFORCE++ 2501.03262; verl adv_estimator=reinforce_plus_plus",
)
def reinforce_plus_plus_advantages(
    rewards: Tensor, group_size: int, *, mask: Tensor | None = None, gamma: float = 1.0
) -> Tensor:
    r"""REINFORCE++ (Hu 2501.03262): the discounted return, whitened over every valid token of the batch.

    .. math:: G_{i,t} = \gamma^{L_i - t} R_i, \qquad A_{i,t} = \frac{G_{i,t} - \mu}{\sqrt{\sigma^2 + 10^{-8}}}

    (``L_i`` the last valid token, ``mu``/``sigma^2`` the mean and unbiased variance of ``G`` over all valid
    tokens of the batch: `masked_whiten`). No group baseline: the batch mean is the baseline, so
    ``group_size`` plays no part. With ``gamma = 1`` (verl's default ``algorithm.gamma``) every token of a
    response carries ``(R_i - mu) / sigma``, mu token-weighted. Example, R = (1, 0), lengths (1, 1): mu 0.5,
    var 0.5, A = (0.707, -0.707). Equal to verl's ``compute_reinforce_plus_plus_outcome_advantage``.
    """
    check_nonnegative("reinforce_plus_plus", "gamma", gamma)
    m = token_mask("reinforce_plus_plus", mask, rewards.shape[0])
    mf = m.to(rewards.dtype)
    # Valid tokens after t within the row, so G = gamma^(that count) * R on valid tokens (verl's running return).
    after = mf.flip(-1).cumsum(-1).flip(-1) - mf
    returns = torch.where(m, rewards.unsqueeze(-1) * gamma**after, 0.0)
    return masked_whiten(returns, m) * mf


@register_advantage_estimator(
    "reinforce_plus_plus_baseline",
    requires=("mask",),
    group_relative=True,
    paper="REINFORCE++ 2501.03262; verl adv_estimator=reinforce_plus_plus_baseline",
)
def reinforce_plus_plus_baseline_advantages(
    rewards: Tensor, group_size: int, *, mask: Tensor | None = None
) -> Tensor:
    r"""REINFORCE++-baseline (Hu 2501.03262): the group mean as baseline, then whitened over the batch's tokens.

    .. math:: A_i = \frac{(R_i - \bar R_g) - \mu}{\sqrt{\sigma^2 + 10^{-8}}}

    ``mu``, ``sigma^2``: mean and unbiased variance of ``R_i - mean_g R`` over every valid token of the batch
    (each response weighted by its length, `masked_whiten`), as verl's
    ``compute_reinforce_plus_plus_baseline_outcome_advantage``. Example, groups (1, 0) and (1, 1), lengths 1:
    centred (0.5, -0.5, 0, 0), mu 0, var 1/6, A = (1.22, -1.22, 0, 0). Unlike ``grpo``, an all-equal group is not
    exactly 0 after whitening (it gets ``-mu / sigma``). With G = 1 verl uses baseline 0; here G = 1 is refused
    by config validation (group-relative) and gives 0 when called directly.
    """
    m = token_mask("reinforce_plus_plus_baseline", mask, rewards.shape[0])
    if group_size == 1:
        return torch.zeros_like(rewards)
    groups = grouped(rewards, group_size)
    centred = torch.where(zero_variance(groups), 0.0, groups - groups.mean(dim=1, keepdim=True)).flatten()
    mean, rstd = _whiten_stats(centred.unsqueeze(-1).expand(m.shape), m)
    return (centred - mean) * rstd


@register_advantage_estimator(
    "grpo_passk", group_relative=True, paper="Pass@k training 2503.19595; verl adv_estimator=grpo_passk"
)
def grpo_passk_advantages(
    rewards: Tensor, group_size: int, *, eps: float = 1e-6, norm_by_std: bool = True
) -> Tensor:
    r"""Pass@k-style GRPO (verl ``grpo_passk``, after Chen et al. 2503.19595): only the group's best response
    learns, by its margin over the runner-up.

    .. math:: A_{i^*} = \frac{R_{(1)} - R_{(2)}}{\operatorname{std}_g R + \epsilon}, \quad i^* = \arg\max_g R,
              \qquad A_i = 0 \text{ for } i \ne i^*

    ``R_(1) >= R_(2)`` the two largest rewards of the group, ``std`` unbiased, ``eps = 1e-6``;
    ``norm_by_std=False`` drops the division (verl's ``norm_adv_by_std_in_grpo``). Example, R = (0, 1, 0, 0):
    margin 1, std 0.5, A = (0, 2, 0, 0) (up to eps). A tie for the best gives margin 0, so which of the tied
    responses is "best" never matters. Needs G >= 2 (ValueError otherwise, as verl).
    """
    check_nonnegative("grpo_passk", "eps", eps)
    if group_size < 2:
        raise ValueError(f"grpo_passk needs at least 2 samples per group, got group_size={group_size}")
    groups = grouped(rewards, group_size)
    top, index = groups.topk(2, dim=1)
    margin = top[:, 0] - top[:, 1]
    if norm_by_std:
        margin = margin / (groups.std(dim=1) + eps)
    adv = torch.zeros_like(groups)
    adv[torch.arange(groups.shape[0], device=groups.device), index[:, 0]] = margin
    return adv.flatten()


@register_advantage_estimator("gpg", group_relative=True, paper="GPG 2504.02546; verl adv_estimator=gpg")
def gpg_advantages(rewards: Tensor, group_size: int, *, f_norm: float = 1.0) -> Tensor:
    r"""GPG, Group Policy Gradient (Chu et al. 2504.02546): the group-centred reward, rescaled by the share of
    responses with a non-zero reward in the whole batch.

    .. math:: A_i = \alpha \, \frac{R_i - \bar R_g}{F}, \qquad \alpha = \frac{N}{\max(1, \#\{j : R_j \ne 0\})}

    ``N`` the batch's responses, ``F = f_norm`` (1 in verl). The paper's correction for all-zero groups diluting
    the gradient. Example, groups (1, 0) and (0, 0): one non-zero of 4, alpha 4, A = (2, -2, 0, 0). All-equal
    groups give 0. Equal to verl's ``compute_gpg_outcome_advantage`` (with G = 1 verl uses baseline 0; here G = 1
    is refused by config validation and gives 0).
    """
    if not f_norm > 0:
        raise ValueError(f"gpg option f_norm must be > 0, got {f_norm!r}")
    if group_size == 1:
        return torch.zeros_like(rewards)
    alpha = rewards.shape[0] / max(int(torch.count_nonzero(rewards)), 1)
    groups = grouped(rewards, group_size)
    adv = alpha * (groups - groups.mean(dim=1, keepdim=True)) / f_norm
    return torch.where(zero_variance(groups), 0.0, adv).flatten()


def _otb_inputs(name: str, rewards, mask, old_logp, sum_pi_squared):
    m = token_mask(name, mask, rewards.shape[0])
    old = token_input(name, "old_logp", old_logp, m)
    s2 = token_input(name, "sum_pi_squared", sum_pi_squared, m)
    mf = m.to(rewards.dtype)
    returns = _outcome_returns(rewards, m)
    w = (1 - 2 * torch.exp(old) + s2) * mf  # ||s_t||^2 = 1 - 2 pi_t + sum_v pi_v^2
    return m, mf, returns, w.cumsum(-1)


def _otb_baselines(returns, w_cum, mf, lengths, rows, handle_zero_tail: bool, eps: float) -> Tensor:
    """Per-step baseline of one group's ``rows``: sum_g(G W m) / (sum_g(W m) + eps), zero tail applied."""
    base = ((returns * w_cum * mf).sum(0) / ((w_cum * mf).sum(0) + eps)).expand(len(rows), -1).clone()
    if handle_zero_tail:
        group_lengths = lengths[rows]
        ordered = torch.sort(group_lengths).values
        longest = (group_lengths == ordered[-1]).nonzero().flatten()
        if longest.numel() == 1 and ordered[-1] > ordered[-2]:
            base[int(longest[0]), int(ordered[-2]) :] = 0.0
    return base


@register_advantage_estimator(
    "optimal_token_baseline",
    requires=("old_logp", "sum_pi_squared", "mask"),
    token_level=True,
    paper="Optimal token baseline 2602.07078; verl adv_estimator=optimal_token_baseline",
)
def optimal_token_baseline_advantages(
    rewards: Tensor,
    group_size: int,
    *,
    old_logp: Tensor | None = None,
    sum_pi_squared: Tensor | None = None,
    mask: Tensor | None = None,
    handle_zero_tail: bool = True,
    eps: float = 1e-8,
) -> Tensor:
    r"""Optimal token baseline (OTB, 2602.07078): a baseline per token position, weighted by path variance.

    .. math:: A_{i,t} = G_{i,t} - B_t, \quad B_t = \frac{\sum_{j \in g} G_{j,t} W_{j,t} m_{j,t}}
              {\sum_{j \in g} W_{j,t} m_{j,t} + \epsilon}, \quad W_{j,t} = \sum_{s \le t} m_{j,s}
              \left(1 - 2\pi_{j,s} + \textstyle\sum_v \pi_{j,s}(v)^2\right)

    ``G`` the outcome return (``R_i`` on every valid token), ``pi_{j,s} = exp(old_logp)`` the sampled token's
    probability under the sampling policy and ``sum_v pi^2`` over the vocabulary (``sum_pi_squared``, computed
    by the trainer's pre-update pass): ``1 - 2 pi + sum pi^2 = ||e_y - pi||^2`` is the squared norm of the
    log-softmax gradient, so ``W`` is the accumulated score-function variance. ``handle_zero_tail``: where one
    response of the group is strictly the longest, its baseline is 0 past the second-longest length (no other
    response to compare with). G = 1: baseline 0, A = G (verl). Equal to verl's
    ``compute_optimal_token_baseline_advantage`` without rollout IS weights (verl scales ``W`` by their square
    when ``rollout_is_weights`` are passed; tepo's trainer passes none).
    """
    check_nonnegative("optimal_token_baseline", "eps", eps)
    m, mf, returns, w_cum = _otb_inputs("optimal_token_baseline", rewards, mask, old_logp, sum_pi_squared)
    lengths = m.sum(-1)
    baselines = torch.zeros_like(returns)
    if group_size > 1:
        for start in range(0, rewards.shape[0], group_size):
            rows = torch.arange(start, start + group_size, device=rewards.device)
            baselines[rows] = _otb_baselines(
                returns[rows], w_cum[rows], mf[rows], lengths, rows, handle_zero_tail, eps
            )
    return (returns - baselines) * mf


@register_advantage_estimator(
    "tir_optimal_token_baseline",
    requires=("old_logp", "sum_pi_squared", "mask"),
    token_level=True,
    paper="Optimal token baseline 2602.07078 (multi-turn); verl adv_estimator=tir_optimal_token_baseline",
)
def tir_optimal_token_baseline_advantages(
    rewards: Tensor,
    group_size: int,
    *,
    old_logp: Tensor | None = None,
    sum_pi_squared: Tensor | None = None,
    mask: Tensor | None = None,
    handle_zero_tail: bool = True,
    eps: float = 1e-8,
) -> Tensor:
    r"""``optimal_token_baseline`` for multi-turn responses (tool calls): positions are the response's own
    valid tokens counted in order, not columns, so observation tokens (mask 0) inside a response do not shift
    the comparison.

    Same equation as ``optimal_token_baseline``, with ``t`` the index of a valid token within its response (the
    valid tokens of every response are packed to the left, the baseline taken, and the result put back);
    responses without a valid token are left out of their group. On tepo's single-turn responses (the mask is
    a prefix of each row) the two estimators are equal. Equal to verl's
    ``compute_multi_turn_optimal_token_baseline_advantage`` (without rollout IS weights).
    """
    check_nonnegative("tir_optimal_token_baseline", "eps", eps)
    m, mf, returns, w_cum = _otb_inputs("tir_optimal_token_baseline", rewards, mask, old_logp, sum_pi_squared)
    lengths = m.sum(-1)
    width = int(lengths.max()) if lengths.numel() else 0
    packed_ret = returns.new_zeros(m.shape[0], width)
    packed_w = returns.new_zeros(m.shape[0], width)
    packed_mask = torch.arange(width, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(-1)
    packed_ret[packed_mask], packed_w[packed_mask] = returns[m], w_cum[m]
    baselines = torch.zeros_like(packed_ret)
    for start in range(0, rewards.shape[0], group_size):
        rows = torch.tensor(
            [r for r in range(start, start + group_size) if lengths[r] > 0],
            dtype=torch.long,
            device=rewards.device,
        )
        if len(rows) < 2:
            continue
        # Packed rows have no gaps (zeros past each length, as verl's packed buffer): the single-turn baseline of
        # the packed group, with its zero tail.
        baselines[rows] = _otb_baselines(
            packed_ret[rows],
            packed_w[rows],
            packed_mask[rows].to(returns.dtype),
            lengths,
            rows,
            handle_zero_tail,
            eps,
        )
    adv = torch.zeros_like(returns)
    adv[m] = (packed_ret - baselines)[packed_mask]
    return adv * mf


GDPO_BATCH_NORMS = ("token", "sequence", "none")


@register_advantage_estimator(
    "gdpo",
    requires=("reward_components", "reward_weights", "mask"),
    group_relative=True,
    paper="GDPO 2601.05242; verl adv_estimator=gdpo; TRL multi_objective_aggregation=normalize_then_sum",
)
def gdpo_advantages(
    rewards: Tensor,
    group_size: int,
    *,
    reward_components: Tensor | None = None,
    reward_weights: Tensor | None = None,
    mask: Tensor | None = None,
    eps: float = 1e-6,
    norm_by_std: bool = True,
    batch_norm: str = "token",
) -> Tensor:
    r"""GDPO, Group reward-Decoupled normalization Policy Optimization (2601.05242): each reward is normalised
    within its group on its own, the normalised rewards are summed with their weights, and the sum is normalised
    over the batch.

    .. math:: \hat A^{(k)}_i = \frac{r^{(k)}_i - \operatorname{mean}_g r^{(k)}}{\operatorname{std}_g r^{(k)}
              + \epsilon}, \qquad S_i = \sum_k w_k \hat A^{(k)}_i, \qquad
              A_i = \frac{S_i - \mu}{\sqrt{\sigma^2 + 10^{-8}}}

    ``r^(k)`` the ``K`` columns of ``reward_components`` ``[N, K]`` (one per reward function of
    ``reward.functions``), ``w_k`` = ``reward_weights`` ``[K]``; ``std`` unbiased, ``eps = 1e-6``;
    ``norm_by_std=False`` drops the division (verl's ``norm_adv_by_std_in_grpo``). ``rewards`` (the weighted
    total the other estimators read) is not used. Batch step ``batch_norm``:

    - ``"token"`` (default, verl 0.9.1 ``compute_gdpo_outcome_advantage``): ``masked_whiten`` over every valid
      token, so ``mu`` and the unbiased ``sigma^2`` weight each response by its length (`masked_whiten`);
    - ``"sequence"`` (the paper's Eq. and TRL 1.16 ``multi_objective_aggregation="normalize_then_sum"``):
      ``A_i = (S_i - mean_N S) / (std_N S + eps)``, each response once, unbiased std; TRL uses ``eps = 1e-4``
      in both places, so TRL's setting is ``eps=1e-4, batch_norm="sequence"``;
    - ``"none"``: ``A_i = S_i``.

    Why: with GRPO on the summed reward, a reward with a large spread drowns the others, and distinct reward
    combinations collapse to one advantage; normalising each reward first gives each its own unit scale. An
    all-equal group of one reward contributes exactly 0 for it (tepo's `zero_variance`; verl divides the float
    residue by ``std + eps``, which is 0 for rewards whose group mean is exact, e.g. 0/1). G = 1: mean 0 and
    std 1 (verl), so ``A^(k) = r^(k) / (1 + eps)``; tepo's config refuses G = 1 for group-relative estimators.
    With K = 1 this is ``grpo`` followed by the batch step. Example, K = 2, w = (1, 1), G = 2, lengths 1,
    r^(1) = (1, 0), r^(2) = (1, 1): A^(1) = (0.707, -0.707), A^(2) = (0, 0), S = (0.707, -0.707), and
    ``"token"`` gives A = (0.707, -0.707) (mean 0, var 1).
    """
    check_nonnegative("gdpo", "eps", eps)
    if batch_norm not in GDPO_BATCH_NORMS:
        raise ValueError(f"gdpo option batch_norm must be one of {GDPO_BATCH_NORMS}, got {batch_norm!r}")
    n = rewards.shape[0]
    m = token_mask("gdpo", mask, n)
    components, weights = _gdpo_inputs(reward_components, reward_weights, n)
    k = components.shape[1]
    groups = components.T.reshape(k, -1, group_size)  # [K, groups, G]
    if group_size == 1:
        normalised = groups / (1 + eps) if norm_by_std else groups
    else:
        centred = groups - groups.mean(dim=-1, keepdim=True)
        if norm_by_std:
            centred = centred / (groups.std(dim=-1, keepdim=True) + eps)
        same = groups.amax(dim=-1, keepdim=True) == groups.amin(dim=-1, keepdim=True)
        normalised = torch.where(same, 0.0, centred)
    summed = (weights.view(k, 1, 1) * normalised).sum(0).flatten()
    if batch_norm == "token":
        mean, rstd = _whiten_stats(summed.unsqueeze(-1).expand(m.shape), m)
        return (summed - mean) * rstd
    if batch_norm == "sequence":
        if n < 2:
            raise ValueError("gdpo batch_norm='sequence' needs at least 2 responses")
        return (summed - summed.mean()) / (summed.std() + eps)
    return summed


def _gdpo_inputs(components, weights, n: int) -> tuple[Tensor, Tensor]:
    if not isinstance(components, Tensor) or components.dim() != 2 or components.shape[0] != n:
        shape = tuple(components.shape) if isinstance(components, Tensor) else type(components).__name__
        raise ValueError(f"gdpo: reward_components must be a Tensor [N={n}, K], got {shape}")
    k = components.shape[1]
    if k < 1:
        raise ValueError("gdpo: reward_components has no column (K = 0); it needs one per reward function")
    if not isinstance(weights, Tensor) or weights.shape != (k,):
        shape = tuple(weights.shape) if isinstance(weights, Tensor) else type(weights).__name__
        raise ValueError(
            f"gdpo: reward_weights must be a Tensor [K={k}] (one per reward column), got {shape}"
        )
    components, weights = components.detach().to(torch.float64), weights.detach().to(torch.float64)
    if not (torch.isfinite(components).all() and torch.isfinite(weights).all()):
        raise ValueError("gdpo: reward_components and reward_weights must be finite")
    return components, weights
