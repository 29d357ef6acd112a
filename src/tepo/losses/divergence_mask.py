"""DPPO's divergence masks (arXiv 2602.04879): dppo_tv, dppo_kl.

Instead of clipping the ratio, DPPO drops a token's policy gradient where the update has already moved the
sampled token's probability ``p = exp(logp)`` too far from the behaviour policy's ``q`` in the direction the
advantage pushes it, measured on the binary distribution {sampled token, everything else}: total variation
``|p - q|`` (dppo_tv) or the binary KL (dppo_kl). ``q`` is the sampler's probability (``rollout_logp``) when given,
else the old policy's. The ratio in the term stays ``r = exp(logp - old)``.

The value is ``-M * r * A`` (prime-rl, SkyRL); verl's ``-A * sg[min(r, C)] * M * logp`` has the same gradient
while ``r < C`` (its C = ``actor.clip_ratio_c``, 3.0 in verl 0.9.1's ActorConfig; the function's own fallback 20
applies only to a config without that field): the parity tests show the difference. verl's thresholds are
``clip_ratio_low`` / ``clip_ratio_high``, 0.2 by default, not the 0.15 / 0.05 below.
"""

from __future__ import annotations

import torch

from tepo.losses._common import (
    behaviour_logp,
    check_eps,
    clip_metrics,
    token_log_ratio,
)
from tepo.losses.inputs import LossInputs
from tepo.losses.registry import register_policy_loss


def _masked_pg(inputs: LossInputs, drop_high: torch.Tensor, drop_low: torch.Tensor):
    """``-M * r * A`` with M = 0 on ``drop_high`` (A > 0) and ``drop_low`` (A < 0); clip_frac_* are their shares."""
    adv = inputs.advantages
    high = inputs.mask & (adv > 0) & drop_high
    low = inputs.mask & (adv < 0) & drop_low
    ratio = torch.exp(token_log_ratio(inputs))
    term = -ratio * adv
    loss_mat = torch.where(high | low, torch.zeros_like(term), term)
    return loss_mat, clip_metrics(low, high, inputs.mask)


@register_policy_loss("dppo_tv", default_agg="token-mean", paper="DPPO 2602.04879 (Binary-TV)")
def dppo_tv(inputs: LossInputs, *, delta_low: float = 0.15, delta_high: float = 0.15):
    """DPPO-Binary-TV: l = -M * r * A, M = 0 where (A > 0 and p - q > delta_high) or (A < 0 and p - q < -delta_low).

    DPPO (arXiv 2602.04879; verl ``dppo_tv``, prime-rl's default loss): p = exp(logp) and q = exp(behaviour) are
    the probabilities of the sampled token (detached, for the mask only); r = exp(logp - old). Where M = 1 the
    gradient is -r * A * grad(logp), where M = 0 it is 0. clip_frac_high / clip_frac_low are the shares of
    valid tokens masked with A > 0 / A < 0. Defaults delta_low = delta_high = 0.15 (the paper's; verl 0.9.1 reads
    ``clip_ratio_low/high``, 0.2 by default).
    """
    check_eps(delta_low=delta_low, delta_high=delta_high)
    diff = (torch.exp(inputs.logp) - torch.exp(behaviour_logp(inputs))).detach()
    return _masked_pg(inputs, diff > delta_high, diff < -delta_low)


# Keeps log((1 - q) / (1 - p)) finite where p or q is 1 (verl adds the same 1e-8 to both).
_BINARY_KL_EPS = 1e-8


@register_policy_loss("dppo_kl", default_agg="token-mean", paper="DPPO 2602.04879 (Binary-KL)")
def dppo_kl(inputs: LossInputs, *, delta: float = 0.05):
    """DPPO-Binary-KL: l = -M * r * A, M = 0 where D > delta and (A > 0, p > q) or (A < 0, p < q).

    D = q*log(q/p) + (1-q)*log((1-q)/(1-p)), the KL between the behaviour and the current policy on the binary
    distribution {sampled token, the rest}; q*log(q/p) is computed as q*(log q - log p) and the second log as
    log((1 - q + 1e-8) / (1 - p + 1e-8)), as verl. DPPO (arXiv 2602.04879), verl ``dppo_kl`` (which has a low and
    a high threshold: ``delta`` sets both). Mask detached; r = exp(logp - old); default delta 0.05.
    """
    check_eps(delta=delta)
    logp = inputs.logp.detach()
    beh = behaviour_logp(inputs)
    p, q = torch.exp(logp), torch.exp(beh)
    kl = q * (beh - logp) + (1.0 - q) * torch.log((1.0 - q + _BINARY_KL_EPS) / (1.0 - p + _BINARY_KL_EPS))
    over = kl > delta
    return _masked_pg(inputs, over & (p > q), over & (p < q))
