"""CPPO (arXiv 2606.10968): DPPO's Binary-TV term under a position-weighted, cumulative trust-region mask.

From the open pull request verl #6731 (head ``7528d2ef66f3c3fa1832e9b37cc8f4624a9076ee``,
``compute_policy_loss_cppo``, ``loss_mode: cppo``), which implements the Binary-TV divergence only (the paper's
main results use a Top-K reduced TV).
"""

from __future__ import annotations

import torch

from tepo.losses._common import check_range, masked_mean_value, optional_number
from tepo.losses.inputs import LossInputs
from tepo.losses.registry import register_policy_loss

VALUE_FORMS = ("ratio", "verl")
_LOG_RATIO_CLAMP = 20.0


def _row_quantile(values: torch.Tensor, valid: torch.Tensor, q: float, empty: float) -> torch.Tensor:
    """Per row, the ``q`` quantile of ``values`` over its valid entries with linear interpolation, as
    ``torch.quantile``; ``empty`` for a row without one."""
    n = valid.sum(dim=-1)
    inf = torch.full((), float("inf"), dtype=values.dtype, device=values.device)
    ordered = torch.where(valid, values, inf).sort(dim=-1).values
    rank = q * (n - 1).clamp(min=0).to(values.dtype)
    below = rank.floor().long()
    above = rank.ceil().long()
    v_below = ordered.gather(-1, below.unsqueeze(-1)).squeeze(-1)
    v_above = ordered.gather(-1, above.unsqueeze(-1)).squeeze(-1)
    value = torch.lerp(v_below, v_above, rank - below.to(values.dtype))
    return torch.where(n > 0, value, torch.full_like(value, empty))


def _exclusive_cumsum(values: torch.Tensor) -> torch.Tensor:
    """``sum_{j<t} values[j]`` along the last dimension (0 at t = 1): the running sum shifted one place right."""
    total = torch.cumsum(values, dim=-1)
    return torch.cat([torch.zeros_like(total[..., :1]), total[..., :-1]], dim=-1)


def cppo_keep(inputs: LossInputs, delta, w_min, delta_b, delta_b_q, delta_b_k, horizon) -> torch.Tensor:
    """CPPO's token mask M (detached): where the update moves pi back toward old, or the weighted divergence
    fits the budget left by the row's prefix."""
    valid = inputs.mask
    dtype = inputs.logp.dtype
    zero = torch.zeros((), dtype=dtype, device=valid.device)
    logp, old = inputs.logp.detach(), inputs.old_logp
    div = torch.where(valid, (torch.exp(logp) - torch.exp(old)).abs(), zero)
    width = logp.shape[-1]
    span = horizon if horizon is not None else width
    position = torch.arange(1, width + 1, device=valid.device, dtype=dtype)
    ramp = ((span - position) / max(span - 1, 1)).clamp(0.0, 1.0)
    weight = torch.where(valid, w_min + (1.0 - w_min) * ramp, zero)
    weighted = weight * div
    spent = _exclusive_cumsum(weighted)
    allowed = _exclusive_cumsum(weight)
    budget = (delta_b_k * _row_quantile(div, valid, delta_b_q, empty=delta_b)).clamp(delta_b, 5.0 * delta_b)
    threshold = torch.clamp(delta + budget.unsqueeze(-1) * allowed - spent, max=delta)
    ratio = torch.exp((logp - old).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    return valid & ((inputs.advantages * (ratio - 1.0) <= 0) | (weighted <= threshold))


def _check_cppo(delta, w_min, delta_b, delta_b_q, delta_b_k, tis_cap, value_form, horizon) -> None:
    check_range("delta", delta, low=0.0, open_low=True)
    check_range("w_min", w_min, low=0.0, high=1.0, open_low=True)
    check_range("delta_b", delta_b, low=0.0)
    check_range("delta_b_q", delta_b_q, low=0.0, high=1.0)
    check_range("delta_b_k", delta_b_k, low=0.0)
    if optional_number("tis_cap", tis_cap) is not None:
        check_range("tis_cap", tis_cap, low=0.0, open_low=True)
    if value_form not in VALUE_FORMS:
        raise ValueError(f"value_form must be one of {', '.join(VALUE_FORMS)}, got {value_form!r}")
    if horizon is not None and (isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1):
        raise ValueError(f"horizon must be None (the padded width) or an integer >= 1, got {horizon!r}")


@register_policy_loss(
    "cppo", default_agg="token-mean", paper="CPPO 2606.10968 (open PR: verl #6731 @7528d2ef)"
)
def cppo(
    inputs: LossInputs,
    *,
    delta: float = 0.15,
    w_min: float = 0.8,
    delta_b: float = 0.02,
    delta_b_q: float = 0.9,
    delta_b_k: float = 1.0,
    tis_cap: float | None = 20.0,
    value_form: str = "ratio",
    horizon: int | None = None,
):
    """CPPO: l = -A * r * sg[min(r, C) / r] * M, M the cumulative, position-weighted Binary-TV trust mask.

    CPPO (arXiv 2606.10968; verl #6731). Detached: ``D = |p - q|`` (sampled-token probabilities of pi and old),
    ``w_t = w_min + (1 - w_min) clip((T - t)/max(T - 1, 1), 0, 1)`` (t 1-based, ``T = horizon``, default the
    padded width), ``Z = w D``, exclusive prefix sums ``S_prev``, ``W_prev``; per row
    ``db_i = clip(delta_b_k * quantile_{delta_b_q}(D over valid), delta_b, 5 delta_b)``, threshold
    ``c = min(delta, delta + db_i W_prev - S_prev)``; keep ``M = [A (r - 1) <= 0 or Z <= c]`` with
    ``r = exp(clamp(logp - old, +-20))``. The gradient is ``-A min(r, C) M grad logp`` (``C = tis_cap``; None: no
    cap, tepo's dppo_tv term under this mask). ``value_form="verl"`` gives verl's value
    ``-A sg[min(r, C)] M logp`` (same gradient). Defaults: the paper's delta 0.15 (dense models), w_min 0.8,
    delta_b 0.02, delta_b_q 0.9, delta_b_k 1, C 20 (the recipe's ``clip_ratio_c``; verl's default is 3).
    On-policy every token is kept (plain policy gradient). Pass ``horizon=max_response_length`` to keep the
    schedule fixed whatever the padding of a micro-batch.

    Metrics: ``cppo_masked_frac`` (share of valid tokens with M = 0; verl's pg_clipfrac), ``cppo_tis_capped_frac``
    (share with r > C among the kept; verl's pg_clipfrac_lower), ``ppo_kl`` (mean of old - logp).
    """
    _check_cppo(delta, w_min, delta_b, delta_b_q, delta_b_k, tis_cap, value_form, horizon)
    keep = cppo_keep(inputs, delta, w_min, delta_b, delta_b_q, delta_b_k, horizon)
    log_ratio = (inputs.logp - inputs.old_logp).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    capped = ratio.detach() if tis_cap is None else ratio.detach().clamp(max=tis_cap)
    kept = keep.to(ratio.dtype)
    if value_form == "verl":
        term = -inputs.advantages * capped * kept * inputs.logp
    else:
        term = -inputs.advantages * ratio * (capped / ratio.detach()) * kept
    over = keep & (ratio.detach() > (float("inf") if tis_cap is None else tis_cap))
    metrics = {
        "cppo_masked_frac": masked_mean_value((inputs.mask & ~keep).float(), inputs.mask),
        "cppo_tis_capped_frac": masked_mean_value(over.float(), inputs.mask),
        "ppo_kl": masked_mean_value(-log_ratio.detach(), inputs.mask),
    }
    return term, metrics
