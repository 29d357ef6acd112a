"""Losses that replace the hard clip by a smooth weight of the ratio: sapo (token gate), vespo (sequence weight)."""

from __future__ import annotations

import math

import torch

from tepo.losses._common import (
    check_positive,
    clip_metrics,
    masked_mean_value,
    sequence_advantage,
    sequence_ratio_metrics,
    token_log_ratio,
)
from tepo.losses.inputs import LossInputs
from tepo.losses.registry import register_policy_loss


@register_policy_loss("sapo", default_agg="seq-mean-token-mean", paper="SAPO 2511.20347")
def sapo(inputs: LossInputs, *, tau_pos: float = 1.0, tau_neg: float = 1.05):
    """SAPO: l = -f(r) * A, f(r) = (4/tau) * sigmoid(tau * (r - 1)), tau = tau_pos where A > 0, else tau_neg.

    SAPO (arXiv 2511.20347; TRL ``loss_type="sapo"`` with ``sapo_temperature_pos/neg``, verl ``sapo``): a soft
    trust region. dl/dlogp = -A * r * 4*sigmoid(x)*(1 - sigmoid(x)), x = tau*(r - 1): at r = 1 the weight is
    4 * 1/4 = 1, the plain policy gradient -A * grad(logp); it decays smoothly as r leaves 1 instead of being cut
    to 0 at a clip boundary, faster for the larger tau (negative advantages by default). Defaults tau_pos 1.0,
    tau_neg 1.05 are the paper's, TRL's and verl 0.9.1's (``ActorConfig``). No token is clipped: clip_frac_* are 0;
    metric ``sapo_gate_mean`` is the mean gradient weight 4*sigmoid(x)*(1 - sigmoid(x)) over valid tokens.
    """
    check_positive(tau_pos=tau_pos, tau_neg=tau_neg)
    ratio = torch.exp(token_log_ratio(inputs))
    adv = inputs.advantages
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0))
    loss_mat = -(4.0 / tau) * gate * adv
    none = torch.zeros_like(inputs.mask)
    metrics = clip_metrics(none, none, inputs.mask)
    g = gate.detach()
    metrics["sapo_gate_mean"] = masked_mean_value(4.0 * g * (1.0 - g), inputs.mask, empty=1.0)
    return loss_mat, metrics


# ln(1e-8): TRL's (and the VESPO authors') lower clamp of the summed log-ratio, so W_i >= 1e-8.
_VESPO_LOG_W_MIN = math.log(1e-8)
_VESPO_LOG_W_MAX = 20.0


@register_policy_loss("vespo", default_agg="token-mean", paper="VESPO 2602.10693")
def vespo(
    inputs: LossInputs,
    *,
    k_pos: float = 2.0,
    lam_pos: float = 3.0,
    k_neg: float = 3.0,
    lam_neg: float = 2.0,
):
    """VESPO: l = -sg[phi_i] * A * logp, phi_i = W_i^k * exp(lam * (1 - W_i)), a smooth sequence weight.

    VESPO (arXiv 2602.10693; TRL ``loss_type="vespo"``, ``get_gamma_weights``): W_i is the *product* sequence
    ratio, log W_i = clamp(sum_t m*(logp - old), ln 1e-8, 20); phi (a gamma-shaped weight, phi(1) = 1, maximal
    at W = k/lam) is detached, so the gradient is REINFORCE's, -phi_i * A * grad(logp). (k, lam) = (k_pos,
    lam_pos) where the sequence advantage A_i >= 0, else (k_neg, lam_neg); defaults 2/3 and 3/2 (TRL's).
    Our reading: the clamp is on the summed log-ratio only; TRL also clamps each token's log-ratio to +-20 and
    multiplies its vLLM sampler correction into W (here the rollout correction stays the separate ``is_weights``).
    Metrics: ``vespo_phi_mean`` over non-empty rows and the sequence-ratio statistics of W_i.
    """
    check_positive(lam_pos=lam_pos, lam_neg=lam_neg)
    for name, value in (("k_pos", k_pos), ("k_neg", k_neg)):
        if not value >= 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    log_w = token_log_ratio(inputs).sum(dim=-1).clamp(_VESPO_LOG_W_MIN, _VESPO_LOG_W_MAX).detach()
    seq_adv = sequence_advantage(inputs)
    positive = seq_adv >= 0
    k = torch.where(positive, torch.full_like(log_w, k_pos), torch.full_like(log_w, k_neg))
    lam = torch.where(positive, torch.full_like(log_w, lam_pos), torch.full_like(log_w, lam_neg))
    w = torch.exp(log_w)
    phi = torch.exp(k * log_w + lam * (1.0 - w))  # in log space: W^k overflows before exp(-lam*W) damps it
    loss_mat = -phi.unsqueeze(-1) * inputs.advantages * inputs.logp
    none = torch.zeros_like(inputs.mask)
    metrics = clip_metrics(none, none, inputs.mask)
    rows = inputs.mask.any(dim=-1)
    metrics["vespo_phi_mean"] = float(phi[rows].mean().item()) if bool(rows.any()) else 1.0
    inf = float("inf")
    metrics.update(
        {k_: v for k_, v in sequence_ratio_metrics(w, seq_adv, inputs, inf, inf).items() if "ratio" in k_}
    )
    return loss_mat, metrics
