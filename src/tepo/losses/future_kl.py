"""FIPO (arXiv 2603.19835): the advantage of each token scaled by its future-KL influence, with dual clip and a
row drop.

From the open pull request TRL #5434 (head ``20463989e8d9fef8dbba7230c7fb11bdd7f6387f``,
``GRPOTrainer.get_fipo_loss_components`` and the ``loss_type == "fipo"`` branches of ``_compute_loss``).
"""

from __future__ import annotations

import math

import torch

from tepo.losses._common import check_eps, check_range, masked_mean_value
from tepo.losses.inputs import LossInputs
from tepo.losses.registry import register_policy_loss
from tepo.losses.token_count import TokenCount, check_token_count, rescale_to_count

_LOG_RATIO_CLAMP = 20.0
# Influence weights are floored at 0.8 and capped at 1 where A < 0 and r exceeds the safety threshold.
_SAFETY_LOW, _SAFETY_HIGH = 0.8, 1.0
_UNCLIPPED_CAP = 10.0  # influence_clip = 0: exp(F) only capped at 10
_MAX_DUAL_CLIPPED_TOKENS = 1  # a row with more tokens past the dual clip is dropped


def _future_kl(k: torch.Tensor, gamma: float) -> torch.Tensor:
    """``F[t] = sum_{j >= t} gamma^(j - t) k[j]`` along the last dimension, by ``F[t] = k[t] + gamma F[t+1]``."""
    out = torch.empty_like(k)
    carry = torch.zeros_like(k[..., 0])
    for t in range(k.shape[-1] - 1, -1, -1):
        carry = k[..., t] + gamma * carry
        out[..., t] = carry
    return out


def _influence_bounds(influence_clip: float, high_only: bool) -> tuple[float, float]:
    if influence_clip == 0:
        return 0.0, _UNCLIPPED_CAP
    return (1.0 if high_only else 1.0 - influence_clip), 1.0 + influence_clip


def _fipo_parts(inputs: LossInputs, o: dict):
    """Per token: the loss term, the influence weights (raw exp(F) and clipped), and per row whether it is kept."""
    valid, adv = inputs.mask, inputs.advantages
    log_ratio = (inputs.logp - inputs.old_logp).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    lr = log_ratio.detach()
    k = torch.where(valid & (lr <= math.log(o["clip_ratio_c"])), lr, torch.zeros_like(lr))
    raw = torch.exp(_future_kl(k, 2.0 ** (-1.0 / o["decay_rate"])))
    lb, ub = _influence_bounds(o["influence_clip"], o["high_only"])
    weight = raw.clamp(lb, ub)
    unsafe = (adv < 0) & (ratio.detach() > o["safety_threshold"])
    weight = torch.where(unsafe, weight.clamp(_SAFETY_LOW, _SAFETY_HIGH), weight)
    scaled = adv * weight
    clipped = ratio.clamp(1.0 - o["eps_low"], 1.0 + o["eps_high"])
    surrogate = torch.maximum(-scaled * ratio, -scaled * clipped)
    cap = -o["clip_ratio_c"] * scaled
    term = torch.where(scaled < 0, torch.minimum(surrogate, cap), surrogate)
    past_cap = valid & (adv < 0) & (surrogate.detach() > cap)
    kept_rows = past_cap.sum(dim=-1) <= _MAX_DUAL_CLIPPED_TOKENS
    return term, raw, weight, (lb, ub), kept_rows


def _check_fipo(o: dict) -> None:
    check_eps(eps_low=o["eps_low"], eps_high=o["eps_high"])
    check_range("clip_ratio_c", o["clip_ratio_c"], low=1.0, open_low=True)
    check_range("decay_rate", o["decay_rate"], low=0.0, open_low=True)
    check_range("influence_clip", o["influence_clip"], low=0.0)
    check_range("safety_threshold", o["safety_threshold"], low=0.0, open_low=True)
    if not isinstance(o["high_only"], bool):
        raise ValueError(f"high_only must be true or false, got {o['high_only']!r}")


def fipo_kept_tokens(inputs: LossInputs, **options) -> TokenCount:
    """The mini-batch statistic of fipo: the valid tokens of the rows it keeps (`tepo.losses.mini_batch_stats`)."""
    options.pop("kept_tokens", None)
    _check_fipo(options)
    kept_rows = _fipo_parts(inputs, options)[-1]
    count = (inputs.mask & kept_rows.unsqueeze(-1)).sum()
    return TokenCount(float(count.item()), "fipo")


@register_policy_loss(
    "fipo",
    default_agg="token-mean",
    paper="FIPO 2603.19835 (open PR: TRL #5434 @20463989)",
    batch_stats=fipo_kept_tokens,
    batch_stats_option="kept_tokens",
)
def fipo(
    inputs: LossInputs,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    clip_ratio_c: float = 10.0,
    decay_rate: float = 32.0,
    influence_clip: float = 0.2,
    high_only: bool = True,
    safety_threshold: float = 10.0,
    kept_tokens: TokenCount | None = None,
):
    """FIPO: A~ = A sg[iw], l = min(max(-A~ r, -A~ clip(r, 1-eps_low, 1+eps_high)), -C A~) where A~ < 0; rows with
    more than one token past the dual clip dropped, the rest divided by the kept tokens.

    FIPO (arXiv 2603.19835), as TRL #5434 computes it. ``r = exp(clamp(logp - old, +-20))``; detached
    ``k[t] = lr[t]`` on valid tokens with ``lr <= ln C`` (else 0), the future KL
    ``F[t] = sum_{j >= t} gamma^(j-t) k[j]`` with ``gamma = 2^(-1/decay_rate)`` (positions absolute); influence
    ``iw = clip(exp(F), 1, 1 + c)`` (``high_only``: weights only amplify), ``clip(exp(F), 1 - c, 1 + c)``, or
    ``min(exp(F), 10)`` when ``c = influence_clip = 0``; where ``A < 0`` and ``r > safety_threshold``,
    ``iw = clip(iw, 0.8, 1)``. A row with more than one valid token where ``A < 0`` and the dual clip binds
    (``r > C``, ``C = clip_ratio_c``) is dropped: value, gradient and count. The sum is divided by the kept
    tokens (a `TokenCount` of the mini-batch through ``mini_batch_stats``; without it, the call's own share,
    `tepo.losses.token_count.rescale_to_count`: TRL's per-micro-batch count). Defaults: TRL's recipe (eps 0.2/0.28, C 10, decay_rate 32, c 0.2,
    high_only, safety 10). On-policy: F = 0, iw = 1, plain clipped PPO.

    Metrics: ``fipo_influence_weights_mean_raw`` (mean exp(F)), ``fipo_influence_weight_clip_ratio_upper`` /
    ``_lower`` (share of tokens with iw at its upper / lower bound, after the safety clamp),
    ``fipo_sequence_drop_ratio`` (share of the call's rows dropped), ``clip_frac_low`` / ``clip_frac_high``.
    """
    options = {
        "eps_low": eps_low,
        "eps_high": eps_high,
        "clip_ratio_c": clip_ratio_c,
        "decay_rate": decay_rate,
        "influence_clip": influence_clip,
        "high_only": high_only,
        "safety_threshold": safety_threshold,
    }
    _check_fipo(options)
    check_token_count(kept_tokens, "fipo")
    term, raw, weight, (lb, ub), kept_rows = _fipo_parts(inputs, options)
    valid = inputs.mask
    kept = valid & kept_rows.unsqueeze(-1)
    term = rescale_to_count(torch.where(kept, term, torch.zeros_like(term)), inputs, kept, kept_tokens)
    ratio, adv = torch.exp(inputs.logp - inputs.old_logp).detach(), inputs.advantages
    rows = torch.ones_like(kept_rows)
    metrics = {
        "clip_frac_low": masked_mean_value(((adv < 0) & (ratio < 1.0 - eps_low)).float(), valid),
        "clip_frac_high": masked_mean_value(((adv > 0) & (ratio > 1.0 + eps_high)).float(), valid),
        "fipo_influence_weights_mean_raw": masked_mean_value(raw, valid),
        "fipo_influence_weight_clip_ratio_upper": masked_mean_value((weight >= ub - 1e-7).float(), valid),
        "fipo_influence_weight_clip_ratio_lower": masked_mean_value((weight <= lb + 1e-7).float(), valid),
        "fipo_sequence_drop_ratio": masked_mean_value((~kept_rows).float(), rows),
    }
    return term, metrics
