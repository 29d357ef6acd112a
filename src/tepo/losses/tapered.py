"""TOPR (arXiv 2503.14286): REINFORCE whose negative sequences are weighted by their tapered sequence ratio.

From the open pull request verl #6986 (head ``dbeb49b4b9758a921d5033022372821f230b9f4c``,
``compute_policy_loss_topr``, ``loss_mode: topr``).
"""

from __future__ import annotations

import torch

from tepo.losses._common import (
    check_range,
    masked_mean_value,
    row_lengths,
    sequence_advantage,
    token_log_ratio,
)
from tepo.losses.inputs import LossInputs
from tepo.losses.registry import register_policy_loss

# verl caps the log sequence ratio before exp so that a far off-policy row cannot overflow.
_MAX_LOG_RATIO = 10.0
SEQ_RATIOS = ("sum", "mean")


@register_policy_loss(
    "topr", default_agg="seq-mean-token-sum", paper="TOPR 2503.14286 (open PR: verl #6986 @dbeb49b4)"
)
def topr(inputs: LossInputs, *, lower: float = 0.0, upper: float = 1.0, seq_ratio: str = "sum"):
    """TOPR: l[i,t] = -A[i,t] * logp[i,t] * sg[w_i], w_i = 1 if a_i >= 0 else clip(exp(min(rho_i, 10)), lower, upper).

    Tapered Off-Policy REINFORCE (arXiv 2503.14286): positive sequences get the plain REINFORCE gradient, negative
    ones the truncated importance weight of the whole sequence. ``a_i = sum_t m*A / max(L_i, 1)`` (its sign
    splits the rows), ``rho_i = sum_t m*(logp - old)`` (``seq_ratio="sum"``, the paper's product ratio) or that
    divided by ``max(L_i, 1)`` (``"mean"``, verl #7022's geometric mean). The weight is detached; the value
    is ``-w A logp`` (no ratio in it). Defaults are the paper's: lower 0, upper 1, ``"sum"``, aggregation
    seq-mean-token-sum (the gradient of log pi(tau) sums over tokens, averaged over sequences). verl's setting is
    ``seq_ratio="mean", agg="seq-mean-token-mean"``. An empty row weighs 1 and adds 0.

    Metrics: ``ppo_kl`` (mean of old - logp), ``topr_negative_seq_frac`` (share of the call's rows, empty ones
    included, with a_i < 0), ``topr_taper_weight_mean`` (mean of w_i over those rows).
    """
    check_range("lower", lower, low=0.0)
    if not upper >= lower:
        raise ValueError(f"topr needs 0 <= lower <= upper, got lower={lower}, upper={upper}")
    if seq_ratio not in SEQ_RATIOS:
        raise ValueError(f"seq_ratio must be one of {', '.join(SEQ_RATIOS)}, got {seq_ratio!r}")
    log_ratio = token_log_ratio(inputs).detach()
    rho = log_ratio.sum(dim=-1)
    if seq_ratio == "mean":
        rho = rho / row_lengths(inputs).clamp(min=1)
    seq_adv = sequence_advantage(inputs)
    taper = torch.exp(rho.clamp(max=_MAX_LOG_RATIO)).clamp(lower, upper)
    weight = torch.where(seq_adv >= 0, torch.ones_like(taper), taper)
    term = -inputs.advantages * inputs.logp * weight.unsqueeze(-1)
    rows = torch.ones_like(seq_adv, dtype=torch.bool)
    metrics = {
        "ppo_kl": masked_mean_value(-log_ratio, inputs.mask),
        "topr_negative_seq_frac": masked_mean_value((seq_adv < 0).float(), rows),
        "topr_taper_weight_mean": masked_mean_value(weight, rows),
    }
    return term, metrics
