"""DAPO with the tokens of zero-variance groups out of the token count (open PR TRL #6365, head
``c17988dead62e0feab6f6191d19b58099b691ae3``; the idea of AGPO, arXiv 2503.15952)."""

from __future__ import annotations

import torch

from tepo.losses._common import (
    check_eps,
    check_range,
    clip_masks,
    clip_metrics,
    optional_number,
    token_log_ratio,
)
from tepo.losses.inputs import LossInputs
from tepo.losses.registry import register_policy_loss
from tepo.losses.token_count import TokenCount, check_token_count, rescale_to_count


def _counted_rows(inputs: LossInputs, tol: float) -> torch.Tensor:
    """Rows that are not zero-variance: some valid token has ``|A| > tol``."""
    return (inputs.mask & (inputs.advantages.abs() > tol)).any(dim=-1)


def dapo_zv_tokens(inputs: LossInputs, **options) -> TokenCount:
    """The mini-batch statistic of dapo_zv: the valid tokens of the rows that are not zero-variance."""
    check_range("tol", options["tol"], low=0.0)
    counted = inputs.mask & _counted_rows(inputs, options["tol"]).unsqueeze(-1)
    return TokenCount(float(counted.sum().item()), "dapo_zv")


@register_policy_loss(
    "dapo_zv",
    default_agg="token-mean",
    paper="DAPO 2503.14476 + AGPO 2503.15952 (open PR: TRL #6365 @c17988de)",
    batch_stats=dapo_zv_tokens,
    batch_stats_option="zv_tokens",
)
def dapo_zv(
    inputs: LossInputs,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    delta: float | None = None,
    tol: float = 1e-6,
    zv_tokens: TokenCount | None = None,
):
    """DAPO over the tokens of non-zero-variance rows: sum_{valid} max(-A min(r, delta), -A clip(r)) / max(N_zv, 1).

    TRL #6365 (``loss_type="dapo_zv"``): DAPO's clipped term (arXiv 2503.14476, eps 0.2/0.28, TRL's optional
    ``delta`` cap on the unclipped branch, None: off), summed over every valid token, divided by ``N_zv``, the
    valid tokens of the rows that are not zero-variance, instead of all of them. TRL tests a group's rewards
    (``max - min <= 1e-6``); a loss sees advantages, so here a row is zero-variance when its advantage is 0
    (``|A| <= tol`` on every valid token). The two agree whenever the estimator gives exactly 0 to all-equal
    groups and non-zero values to the others (GRPO on 0/1 rewards; tepo's grpo zeroes all-equal groups). ``N_zv``
    is a statistic of the mini-batch (a `TokenCount` through ``mini_batch_stats``; without it, the call's own share,
    `tepo.losses.token_count.rescale_to_count`).
    With no zero-variance row it is ``dapo``. No metric beyond the clip shares.
    """
    check_eps(eps_low=eps_low, eps_high=eps_high)
    check_range("tol", tol, low=0.0)
    if optional_number("delta", delta) is not None:
        check_range("delta", delta, low=1.0, open_low=True)
    check_token_count(zv_tokens, "dapo_zv")
    adv = inputs.advantages
    ratio = torch.exp(token_log_ratio(inputs))
    capped = ratio if delta is None else ratio.clamp(max=delta)
    term = torch.maximum(-adv * capped, -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high))
    counted = inputs.mask & _counted_rows(inputs, tol).unsqueeze(-1)
    low, high = clip_masks(ratio.detach(), adv, inputs.mask, eps_low, eps_high)
    return rescale_to_count(term, inputs, counted, zv_tokens), clip_metrics(low, high, inputs.mask)
