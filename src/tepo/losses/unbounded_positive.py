"""UP-GRPO (arXiv 2607.06987): plain REINFORCE on positive-advantage tokens, the clipped surrogate on the rest.

From two open pull requests: verl #7022 (head ``0257b18e41c969efe13fd03f35c3477eccd4c1e9``,
``compute_policy_loss_up``, ``loss_mode: up``) and TRL #6579 (``trl/experimental/up``; its head is not in the
snapshot the spec was written from, the code read is at ``d8415581b77a19153ae662b24075d79314e45a6f``).
"""

from __future__ import annotations

import torch

from tepo.losses._common import (
    check_range,
    clamped_log_ratio,
    masked_mean_value,
    masked_min_value,
    optional_number,
)
from tepo.losses.inputs import LossInputs
from tepo.losses.registry import register_policy_loss


def _check_up(eps_low, eps_high, delta, dual_clip, log_ratio_clamp) -> None:
    check_range("eps_low", eps_low, low=0.0, high=1.0, open_high=True)
    check_range("eps_high", eps_high, low=0.0)
    for name, value in (("delta", delta), ("dual_clip", dual_clip)):
        if optional_number(name, value) is not None:
            check_range(name, value, low=1.0, open_low=True)
    if optional_number("log_ratio_clamp", log_ratio_clamp) is not None:
        check_range("log_ratio_clamp", log_ratio_clamp, low=0.0, open_low=True)


def _up_metrics(inputs, ratio, log_ratio, low, dual, eps_low, delta) -> dict:
    adv, valid = inputs.advantages, inputs.mask
    negative = valid & (adv <= 0)
    clipped = ratio.clamp(min=1.0 - eps_low)  # for A <= 0 only the lower clip can beat r
    capped = ratio if delta is None else ratio.clamp(max=delta)
    trl_low = valid & (adv < 0) & (capped < 1.0 - eps_low)
    row_share = trl_low.sum(dim=-1).to(ratio.dtype) / valid.sum(dim=-1).clamp(min=1).to(ratio.dtype)
    return {
        "clip_frac_low": masked_mean_value(low.float(), valid),
        "ppo_kl": masked_mean_value(-log_ratio, valid),
        "up_clipfrac": masked_mean_value((-adv * clipped > -adv * ratio).float(), negative),
        "up_clipfrac_lower": masked_mean_value(dual.float(), valid),
        "up_low_mean": masked_mean_value(trl_low.float(), valid),
        "up_low_min": masked_min_value(row_share, valid.any(dim=-1)),
    }


@register_policy_loss(
    "up", default_agg="token-mean", paper="UP 2607.06987 (open PRs: verl #7022 @0257b18e, TRL #6579)"
)
def up(
    inputs: LossInputs,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    delta: float | None = None,
    dual_clip: float | None = None,
    log_ratio_clamp: float | None = 20.0,
):
    """UP-GRPO: l = -A * exp(logp - sg[logp]) where A > 0, else max(-A*min(r, delta), -A*clip(r, 1-eps_low, 1+eps_high)).

    UP (arXiv 2607.06987; verl #7022 Eq. 15, TRL #6579 Eqs. 12-14). A positive-advantage token gets the
    self-anchored ratio: value exactly ``-A``, gradient ``-A * grad logp`` (plain REINFORCE, no clip, no ``old``).
    A token with ``A <= 0`` keeps the clipped surrogate on ``r = exp(clamp(logp - old, +-log_ratio_clamp))``
    (verl clamps at 20, TRL not at all: ``log_ratio_clamp=None``), with TRL's ``delta`` cap on the unclipped branch
    (None: off; with it off ``eps_high`` is inert). ``dual_clip=c`` (None: off, the paper's negative branch)
    caps the term at ``-c*A`` where ``A < 0``: verl keeps it, so verl parity is ``dual_clip=3.0``. ``A = 0``
    gives 0. Aggregation token-mean. Options: eps_low in [0, 1), eps_high >= 0, delta and dual_clip None or > 1.

    Metrics: ``clip_frac_low`` (A < 0, r < 1 - eps_low), ``ppo_kl`` (mean of old - logp), verl's
    ``up_clipfrac`` (share of the A <= 0 tokens where the clipped branch is larger) and ``up_clipfrac_lower``
    (share of tokens the dual clip caps), TRL's ``up_low_mean`` / ``up_low_min`` (share of tokens with
    A < 0 and min(r, delta) < 1 - eps_low; its smallest per-sequence share).
    """
    _check_up(eps_low, eps_high, delta, dual_clip, log_ratio_clamp)
    adv = inputs.advantages
    log_ratio = clamped_log_ratio(inputs, log_ratio_clamp)
    ratio = torch.exp(log_ratio)
    capped = ratio if delta is None else ratio.clamp(max=delta)
    negative = torch.maximum(-adv * capped, -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high))
    dual = torch.zeros_like(inputs.mask)
    if dual_clip is not None:
        cap = -dual_clip * adv
        dual = inputs.mask & (adv < 0) & (negative > cap)
        negative = torch.where(adv < 0, torch.minimum(negative, cap), negative)
    positive = -adv * torch.exp(inputs.logp - inputs.logp.detach())
    term = torch.where(adv > 0, positive, negative)
    low = inputs.mask & (adv < 0) & (ratio.detach() < 1.0 - eps_low)
    metrics = _up_metrics(inputs, ratio.detach(), log_ratio.detach(), low, dual, eps_low, delta)
    return term, metrics
