"""Losses built on the sequence ratio ``s_i = exp(mean_t m*(logp - old))``: tepo, gspo, gmpo, reinforce_is, luspo,
tepo_token, gspo_token."""

from __future__ import annotations

import torch

from tepo.losses._common import (
    check_eps,
    clip_masks,
    clip_metrics,
    clipped_surrogate,
    row_lengths,
    sequence_advantage,
    sequence_log_ratio,
    sequence_ratio_metrics,
    token_log_ratio,
)
from tepo.losses.inputs import LossInputs
from tepo.losses.registry import register_policy_loss


def _sequence_clip_loss(inputs: LossInputs, eps_low: float, eps_high: float):
    check_eps(eps_low=eps_low, eps_high=eps_high)
    seq_ratio = torch.exp(sequence_log_ratio(inputs))  # [N], differentiable w.r.t. every valid logp of row i
    ratio = seq_ratio.unsqueeze(-1).expand_as(inputs.logp)
    low, high = clip_masks(ratio, inputs.advantages, inputs.mask, eps_low, eps_high)
    metrics = clip_metrics(low, high, inputs.mask)
    metrics.update(sequence_ratio_metrics(seq_ratio, sequence_advantage(inputs), inputs, eps_low, eps_high))
    return clipped_surrogate(ratio, inputs.advantages, eps_low, eps_high), metrics


@register_policy_loss("tepo", default_agg="token-mean", paper="TEPO 2510.09369 Eq. 10")
def tepo(inputs: LossInputs, *, eps_low: float = 0.2, eps_high: float = 0.2):
    """TEPO: l = -min(s_i*A, clip(s_i, 1-eps, 1+eps)*A), s_i = exp(sum_t m*(logp-old) / sum_t m), token-mean.

    TEPO v1 (arXiv 2510.09369) Eq. 10: the Markov-likelihood (geometric-mean) sequence ratio IS_i of Sec. 3.2.2
    multiplies every token's advantage and the sum runs over all tokens divided by T_tot = sum_i |o_i|
    (token-mean), so a sequence weighs in proportion to its length. Unclipped, Algorithm 1 gives
    dL/dlogp[i,t] = -m[i,t] * s_i * (sum_t' m*A[i,t']) / (|o_i| * T_tot), i.e. -s_i*A_i/T_tot for a sequence-level
    advantage. The paper's eps is symmetric (eps_low = eps_high = 0.2; ``eps=`` sets both); Eq. 10's constraint
    0 < #correct < G is dynamic sampling, done by the pipeline.
    """
    return _sequence_clip_loss(inputs, eps_low, eps_high)


@register_policy_loss("gspo", default_agg="seq-mean-token-mean", paper="GSPO 2507.18071")
def gspo(inputs: LossInputs, *, eps_low: float = 3e-4, eps_high: float = 4e-4):
    """GSPO: l = -min(s_i*A, clip(s_i, 1-eps_low, 1+eps_high)*A), same s_i as tepo, seq-mean-token-mean.

    GSPO (arXiv 2507.18071) Eq. 5-7: sequence-level ratio and clipping, every sequence weighted equally
    (1/G sum_i), eps 3e-4 / 4e-4. It differs from ``tepo`` only in aggregation: tepo * T_tot weighs row i by
    |o_i| where gspo * N weighs it by 1. With token-level advantages this is GSPO-token's value but not its
    gradient (here every token of row i receives the row's mean advantage): ``gspo_token`` is GSPO-token.
    """
    return _sequence_clip_loss(inputs, eps_low, eps_high)


@register_policy_loss("gmpo", default_agg="seq-mean-token-mean", paper="GMPO 2507.20673")
def gmpo(inputs: LossInputs, *, eps_low: float = 0.4, eps_high: float = 0.4):
    """GMPO: l_i = -A_i * exp(mean_t m*clip_A(logp-old)), the geometric mean of token-clipped ratios.

    GMPO (arXiv 2507.20673) Eq. 4: maximise (prod_t |min(r_t*A, clip(r_t, e^-eps_low, e^eps_high)*A)|)^(1/|o|)
    * sgn(A). Written in log space with d = logp - old and dc = clamp(d, -eps_low, eps_high): the per-token
    log-ratio is min(d, dc) when A_i >= 0 and max(d, dc) when A_i < 0, so **eps_low / eps_high here are
    log-space bounds** (default (-0.4, 0.4), the paper's). The sequence term is broadcast to every token and the
    default seq-mean-token-mean aggregation gives the paper's (1/N) sum_i. A token-level advantage is reduced
    to A_i = its mean over the row's tokens (as verl's geo_mean does). clip_frac_* count tokens whose log-ratio
    was clamped in the direction that zeroes their gradient.
    """
    check_eps(eps_low=eps_low, eps_high=eps_high)
    log_ratio = token_log_ratio(inputs)
    clamped = log_ratio.clamp(-eps_low, eps_high)
    seq_adv = sequence_advantage(inputs)
    positive = (seq_adv >= 0).unsqueeze(-1).expand_as(log_ratio)
    chosen = torch.where(positive, torch.minimum(log_ratio, clamped), torch.maximum(log_ratio, clamped))
    chosen = torch.where(inputs.mask, chosen, torch.zeros((), dtype=chosen.dtype, device=chosen.device))
    seq_ratio = torch.exp(chosen.sum(dim=-1) / row_lengths(inputs).clamp(min=1))
    loss_mat = (-seq_adv * seq_ratio).unsqueeze(-1).expand_as(log_ratio)

    adv = seq_adv.unsqueeze(-1).expand_as(log_ratio)
    high = inputs.mask & (adv > 0) & (log_ratio > eps_high)
    low = inputs.mask & (adv < 0) & (log_ratio < -eps_low)
    metrics = clip_metrics(low, high, inputs.mask)
    rows = inputs.mask.any(dim=-1)
    metrics["seq_ratio_mean"] = float(seq_ratio.detach()[rows].mean().item()) if bool(rows.any()) else 1.0
    metrics["seq_ratio_max"] = float(seq_ratio.detach()[rows].max().item()) if bool(rows.any()) else 1.0
    return loss_mat, metrics


@register_policy_loss("reinforce_is", default_agg="token-mean", paper="TEPO 2510.09369 Sec. 4.3.2")
def reinforce_is(inputs: LossInputs):
    """REINFORCE with a sequence IS weight: l = -sg[s_i] * A * logp (TEPO Table 2, "w. Reinforce").

    TEPO v1 (arXiv 2510.09369) Sec. 4.3.2: the detached geometric-mean sequence ratio s_i times A times the
    token log-probability, token-mean aggregation; no clipping (clip_frac_* are 0).
    """
    seq_ratio = torch.exp(sequence_log_ratio(inputs))
    loss_mat = -seq_ratio.detach().unsqueeze(-1) * inputs.advantages * inputs.logp
    none = torch.zeros_like(inputs.mask)
    metrics = clip_metrics(none, none, inputs.mask)
    metrics.update(
        sequence_ratio_metrics(seq_ratio, sequence_advantage(inputs), inputs, float("inf"), float("inf"))
    )
    return loss_mat, metrics


@register_policy_loss("luspo", default_agg="seq-mean-token-sum", paper="LUSPO 2602.05261")
def luspo(inputs: LossInputs, *, eps_low: float = 0.2, eps_high: float = 0.2):
    """LUSPO: the tepo/gspo sequence term l_i = -min(s_i*A, clip(s_i, 1-eps_low, 1+eps_high)*A) on every token,
    aggregated seq-mean-token-sum, i.e. (1/N) sum_i |o_i| * l_i.

    LUSPO (arXiv 2602.05261), TRL ``loss_type="luspo"`` (``(per_token_loss * mask).sum(-1).mean()``): GSPO's
    objective with each sequence scaled by its length, which removes GSPO's bias towards short responses.
    ``tepo`` sums the same terms over tokens and divides by T_tot instead of N, so on one batch (same eps)
    luspo = tepo * T_tot / N, value and gradient: TEPO's objective up to a per-batch constant. eps defaults to
    TRL's (``epsilon`` 0.2, ``epsilon_high`` None = the same).
    """
    return _sequence_clip_loss(inputs, eps_low, eps_high)


def _token_sequence_clip_loss(inputs: LossInputs, eps_low: float, eps_high: float):
    """GSPO-token's ratio s[i,t] (value s_i, gradient s_i * grad logp[i,t]), clipped with each token's own A."""
    check_eps(eps_low=eps_low, eps_high=eps_high)
    seq_log = sequence_log_ratio(inputs)
    # log s[i,t] = sg[log s_i] + logp - sg[logp]: the value of the sequence ratio, the gradient of one token.
    ratio = torch.exp(seq_log.detach().unsqueeze(-1) + inputs.logp - inputs.logp.detach())
    low, high = clip_masks(ratio, inputs.advantages, inputs.mask, eps_low, eps_high)
    metrics = clip_metrics(low, high, inputs.mask)
    seq_ratio = torch.exp(seq_log.detach())
    metrics.update(sequence_ratio_metrics(seq_ratio, sequence_advantage(inputs), inputs, eps_low, eps_high))
    return clipped_surrogate(ratio, inputs.advantages, eps_low, eps_high), metrics


@register_policy_loss("tepo_token", default_agg="token-mean", paper="TEPO 2510.09369 + GSPO-token 2507.18071")
def tepo_token(inputs: LossInputs, *, eps_low: float = 0.2, eps_high: float = 0.2):
    """TEPO with GSPO-token's ratio: l = -min(s[i,t]*A[i,t], clip(s[i,t], 1-eps, 1+eps)*A[i,t]), token-mean.

    s[i,t] = sg[s_i] * pi(y_t) / sg[pi(y_t)], i.e. log s[i,t] = sg[log s_i] + logp - sg[logp] (GSPO arXiv
    2507.18071 Sec. 4.3): its value is TEPO's s_i, its gradient s_i * grad(logp[i,t]) alone, so each token is
    driven by its own advantage A[i,t] (token-level estimators such as ``entropy_adv`` and ``erpo``). Unclipped,
    dL/dlogp[i,t] = -m[i,t] * s_i * A[i,t] / T_tot; with a sequence-level A_i that is tepo's gradient, and the
    value is tepo's too. The clip acts per token on (s_i, sign of A[i,t]).
    """
    return _token_sequence_clip_loss(inputs, eps_low, eps_high)


@register_policy_loss("gspo_token", default_agg="seq-mean-token-mean", paper="GSPO 2507.18071 Sec. 4.3")
def gspo_token(inputs: LossInputs, *, eps_low: float = 3e-4, eps_high: float = 4e-4):
    """GSPO-token: l = -min(s[i,t]*A[i,t], clip(s[i,t], 1-eps_low, 1+eps_high)*A[i,t]), seq-mean-token-mean.

    GSPO (arXiv 2507.18071) Sec. 4.3 Eq. 13-14: s[i,t] = sg[s_i] * pi(y_t) / sg[pi(y_t)], the value of the
    sequence ratio with the gradient of the token's own log-prob (see ``tepo_token``); TRL experimental
    ``gspo_token``, verl ``gspo`` (which builds the same ratio). With a sequence-level A_i it equals ``gspo``,
    value and gradient. eps 3e-4 / 4e-4 as gspo.
    """
    return _token_sequence_clip_loss(inputs, eps_low, eps_high)
