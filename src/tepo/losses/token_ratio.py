"""Losses built on the per-token ratio ``r[i,t] = exp(logp - old)``: grpo, dapo, dr_grpo, cispo, prefix_is; and
cispo_seq, CISPO's weight on the sequence ratio (TRL's cispo at ``importance_sampling_level="sequence"``), kept
beside cispo so the two share one weight rule.

The PPO-clipped three (grpo, dapo, dr_grpo) take the ``dual_clip`` option; cispo and cispo_seq take an optional
``eps_low`` and a ``cap`` that replaces ``1 + eps_high``.
"""

from __future__ import annotations

import torch

from tepo.losses._common import (
    check_eps,
    clip_masks,
    clip_metrics,
    clipped_surrogate,
    masked_mean_value,
    optional_number,
    sequence_log_ratio,
    token_log_ratio,
)
from tepo.losses.inputs import LossInputs
from tepo.losses.registry import register_policy_loss


def _ppo_clip_loss(
    inputs: LossInputs, eps_low: float, eps_high: float, dual_clip: float | None = None
) -> tuple[torch.Tensor, dict[str, float]]:
    check_eps(eps_low=eps_low, eps_high=eps_high)
    dual_clip = optional_number("dual_clip", dual_clip)
    ratio = torch.exp(token_log_ratio(inputs))
    low, high = clip_masks(ratio, inputs.advantages, inputs.mask, eps_low, eps_high)
    term = clipped_surrogate(ratio, inputs.advantages, eps_low, eps_high)
    metrics = clip_metrics(low, high, inputs.mask)
    if dual_clip is not None:
        term, capped = _dual_clip(term, inputs.advantages, dual_clip)
        metrics["clip_frac_dual"] = masked_mean_value((capped & inputs.mask).float(), inputs.mask)
    return term, metrics


def _dual_clip(term: torch.Tensor, adv: torch.Tensor, c: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Dual-clip PPO (Ye et al. 1912.09729 Eq. 5): where A < 0 the term becomes min(-c*A, term), c > 1.

    With A < 0 the clipped term -min(r*A, clip(r)*A) = -r*A grows without bound in r; dual-clip caps it at c*|A|
    (constant, zero gradient) where r > c. verl's ``vanilla`` applies it with ``clip_ratio_c`` (3.0 by default);
    TRL's ``delta`` clamps r at delta inside the same min, which gives this value when delta > 1 + eps_high.
    Returns the new term and where the cap is active.
    """
    if not c > 1:
        raise ValueError(
            f"dual_clip must be > 1 (the ratio above which a negative-advantage term is capped), got {c}"
        )
    cap = -c * adv
    capped = (adv < 0) & (cap < term)
    return torch.where(adv < 0, torch.minimum(term, cap), term), capped


@register_policy_loss("grpo", default_agg="seq-mean-token-mean", paper="DeepSeekMath 2402.03300")
def grpo(inputs: LossInputs, *, eps_low: float = 0.2, eps_high: float = 0.2, dual_clip: float | None = None):
    """GRPO clipped surrogate, per token: l = -min(r*A, clip(r, 1-eps_low, 1+eps_high)*A).

    r[i,t] = exp(logp - old). Default aggregation seq-mean-token-mean (mean over tokens, then over sequences),
    as in DeepSeekMath (arXiv 2402.03300) Eq. 3. The KL-to-reference term of the paper is the separate
    ``kl_coef`` regularizer (estimator k3 is the paper's choice). ``dual_clip=c`` (off by default; also on dapo
    and dr_grpo) caps the term at -c*A where A < 0 (`_dual_clip`; verl's ``vanilla`` has it on at c = 3).
    """
    return _ppo_clip_loss(inputs, eps_low, eps_high, dual_clip)


@register_policy_loss("dapo", default_agg="token-mean", paper="DAPO 2503.14476")
def dapo(inputs: LossInputs, *, eps_low: float = 0.2, eps_high: float = 0.28, dual_clip: float | None = None):
    """DAPO (Clip-Higher, token-level mean): l = -min(r*A, clip(r, 1-eps_low, 1+eps_high)*A), eps 0.2/0.28.

    DAPO (arXiv 2503.14476) Eq. 8: the same term as GRPO with a wider upper clip and token-mean aggregation
    (1 / sum_i |o_i|). Dynamic sampling and the overlong penalty belong to the pipeline, not to this loss.
    """
    return _ppo_clip_loss(inputs, eps_low, eps_high, dual_clip)


@register_policy_loss("dr_grpo", default_agg="seq-mean-token-sum-norm", paper="Dr. GRPO 2503.20783")
def dr_grpo(
    inputs: LossInputs, *, eps_low: float = 0.2, eps_high: float = 0.2, dual_clip: float | None = None
):
    """Dr. GRPO: l = -min(r*A, clip(r, 1-eps, 1+eps)*A), aggregated sum / (N * L_max).

    Dr. GRPO (arXiv 2503.20783) removes GRPO's 1/|o_i| length normalisation: the sum over all tokens is divided
    by a constant (the number of sequences times a fixed maximum length ``max_len``). Its advantage drops the
    std division (``tepo.advantages`` "dr_grpo").
    """
    return _ppo_clip_loss(inputs, eps_low, eps_high, dual_clip)


_CISPO_EPS_HIGH = 0.28


def _cispo_weight(
    ratio: torch.Tensor, inputs: LossInputs, eps_high: float, eps_low: float | None, cap: float | None
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO's detached weight ``sg[clip(ratio, floor, ceiling)]`` and its clip metrics (per token).

    ``ceiling = cap`` when given (any ``c > 0``; TRL's ``epsilon_high`` is the cap itself), else ``1 + eps_high``;
    ``floor = 1 - eps_low`` when given, else 0. ``cap`` with a non-default ``eps_high`` is refused (one ceiling).
    """
    cap = optional_number("cap", cap)
    eps_low = optional_number("eps_low", eps_low)
    if cap is None:
        check_eps(eps_high=eps_high)
        ceiling = 1.0 + eps_high
    elif not cap > 0:
        raise ValueError(f"cap must be > 0 (the IS weight's ceiling), got {cap}")
    elif eps_high != _CISPO_EPS_HIGH:
        raise ValueError(f"cap={cap} and eps_high={eps_high} both set the IS weight's ceiling: set one")
    else:
        ceiling = cap
    floor = 0.0
    if eps_low is not None:
        check_eps(eps_low=eps_low)
        floor = 1.0 - eps_low
        if floor > ceiling:
            raise ValueError(f"the lower clip 1 - eps_low = {floor} is above the ceiling {ceiling}")
    weight = ratio.clamp(floor, ceiling).detach()
    truncated = inputs.mask & (ratio > ceiling)
    raised = inputs.mask & (ratio < floor)
    return weight, clip_metrics(raised, truncated, inputs.mask)


@register_policy_loss("cispo", default_agg="token-mean", paper="MiniMax-M1 2506.13585")
def cispo(
    inputs: LossInputs,
    *,
    eps_high: float = _CISPO_EPS_HIGH,
    eps_low: float | None = None,
    cap: float | None = None,
):
    """CISPO: l = -sg[clip(r, 0, 1+eps_high)] * A * logp (clipped IS weight, never a dropped token).

    MiniMax-M1 (arXiv 2506.13585) Eq. 4-5: the importance weight is truncated and detached, so every token
    keeps the REINFORCE gradient -w*A*grad(logp). The loss *value* is -w*A*logp (not a surrogate of r).
    clip_frac_high counts tokens whose weight was truncated (r above the ceiling), whatever the sign of A. By
    default there is no lower clip (MiniMax, TRL), so clip_frac_low is 0. ``eps_low`` set clips both sides,
    ``sg[clip(r, 1-eps_low, 1+eps_high)]`` (verl, slime, SkyRL, NeMo), and clip_frac_low counts the tokens whose
    weight was raised to 1-eps_low. ``cap=c`` (any c > 0) sets the ceiling itself, ``sg[min(r, c)]``: TRL's
    ``loss_type="cispo"`` clamps r at ``epsilon_high`` (5.0 recommended; 0.2, its ``epsilon``, when unset), a
    ceiling below 1 included. ``eps=`` is not accepted (it would silently turn on the lower clip).
    """
    ratio = torch.exp(token_log_ratio(inputs))
    weight, metrics = _cispo_weight(ratio, inputs, eps_high, eps_low, cap)
    return -weight * inputs.advantages * inputs.logp, metrics


@register_policy_loss(
    "cispo_seq",
    default_agg="token-mean",
    paper="MiniMax-M1 2506.13585 (CISPO); GSPO 2507.18071 (sequence ratio)",
)
def cispo_seq(
    inputs: LossInputs,
    *,
    eps_high: float = _CISPO_EPS_HIGH,
    eps_low: float | None = None,
    cap: float | None = None,
):
    """CISPO on the sequence ratio: l[i,t] = -sg[clip(s_i, 0, 1+eps_high)] * A * logp[i,t].

    ``s_i = exp(sum_t m*(logp - old) / sum_t m)`` (GSPO's and TEPO's length-normalised ratio) replaces the token
    ratio inside CISPO's detached, truncated weight (MiniMax-M1 Eq. 4-5); each token keeps its REINFORCE gradient
    ``-w_i * A * grad(logp[i,t])``, the weight carries none. This is TRL 1.16's ``loss_type="cispo"`` with
    ``importance_sampling_level="sequence"`` (``cap=epsilon_high``), aggregated as its cispo (token-mean), which
    TRL warns weights each sequence by its length. Options as ``cispo``: ``cap``, ``eps_high``, ``eps_low``;
    clip_frac_high / _low count the tokens of rows whose weight was truncated / raised.
    """
    ratio = torch.exp(sequence_log_ratio(inputs)).unsqueeze(-1).expand_as(inputs.logp)
    weight, metrics = _cispo_weight(ratio, inputs, eps_high, eps_low, cap)
    return -weight * inputs.advantages * inputs.logp, metrics


@register_policy_loss("prefix_is", default_agg="token-mean", paper="TEPO 2510.09369 Sec. 4.3.2")
def prefix_is(inputs: LossInputs, *, eps_low: float = 0.2, eps_high: float = 0.2):
    """Prefix importance sampling: l = -min(s[i,t]*A, clip(s[i,t], 1-eps_low, 1+eps_high)*A).

    TEPO (arXiv 2510.09369) Sec. 4.3.2: s[i,t] = (pi(y_<=t)/pi_old(y_<=t))^(1/|y_<=t|), i.e. the exponential of
    the masked running mean of the log-ratio, exp(sum_{j<=t} m*(logp-old) / sum_{j<=t} m). Masked tokens do not
    count in the prefix length (our reading for non-contiguous masks; identical for ordinary right padding).
    """
    check_eps(eps_low=eps_low, eps_high=eps_high)
    counts = torch.cumsum(inputs.mask.to(inputs.logp.dtype), dim=-1).clamp(min=1)
    prefix_ratio = torch.exp(torch.cumsum(token_log_ratio(inputs), dim=-1) / counts)
    low, high = clip_masks(prefix_ratio, inputs.advantages, inputs.mask, eps_low, eps_high)
    return clipped_surrogate(prefix_ratio, inputs.advantages, eps_low, eps_high), clip_metrics(
        low, high, inputs.mask
    )
