"""Covariance-based losses (Cui et al. 2505.22617 and successors): clip_cov, kl_cov, cov_gauss.

All three score each valid token by ``cov[i,t] = (logp - mean logp) * (A - mean A)`` with the means taken over
the valid tokens, detached. **Those batch statistics (the means, the std of ``cov``, the top-k share and the
random pick) are computed per call**, over the tokens of that call, as verl does: the losses are therefore not
invariant to splitting a mini-batch into micro-batches. To make the means and the std global, compute them once
on the whole mini-batch with `covariance_stats` and pass ``cov_stats=`` to every micro-batch call; ``cov_gauss``
is then exactly split-invariant. The share-based selections of ``clip_cov`` / ``kl_cov`` still count the
tokens of each call (``max(1, int(ratio * n_valid))``); they are split-invariant only when the share selects
every candidate (``ratio=1``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tepo.losses._common import check_eps, clip_masks, clip_metrics, clipped_surrogate, token_log_ratio
from tepo.losses.inputs import LossInputs
from tepo.losses.registry import register_policy_loss


@dataclass(frozen=True)
class CovStats:
    """Global statistics of a mini-batch for the covariance losses (see `covariance_stats`)."""

    mean_logp: float
    mean_adv: float
    std_cov: float


def _stats_of(logp: torch.Tensor, adv: torch.Tensor, valid: torch.Tensor) -> CovStats:
    count = int(valid.sum().item())
    if count == 0:
        return CovStats(0.0, 0.0, 0.0)
    logp = logp.detach().double()
    adv = adv.detach().double()
    mean_logp = float(torch.where(valid, logp, 0.0).sum().item() / count)
    mean_adv = float(torch.where(valid, adv, 0.0).sum().item() / count)
    cov = (logp - mean_logp) * (adv - mean_adv)
    mean_cov = torch.where(valid, cov, 0.0).sum() / count
    var = torch.where(valid, (cov - mean_cov) ** 2, 0.0).sum() / count
    return CovStats(mean_logp, mean_adv, float(var.sqrt().item()))


def covariance_stats(logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> CovStats:
    """Means of logp and A over the valid tokens, and the population std (ddof 0) of ``cov`` over them.

    ``advantages`` may be [N] or [N, T]. Masked entries may hold anything (they are selected away).
    """
    valid = mask.bool()
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(logp)
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    return _stats_of(
        torch.where(valid, logp, zero), torch.where(valid, advantages.to(logp.dtype), zero), valid
    )


def _covariance(inputs: LossInputs, cov_stats: CovStats | None) -> tuple[torch.Tensor, CovStats]:
    stats = cov_stats if cov_stats is not None else _stats_of(inputs.logp, inputs.advantages, inputs.mask)
    if not isinstance(stats, CovStats):
        raise ValueError(
            f"cov_stats must be a tepo.losses.CovStats (see covariance_stats), got {type(stats).__name__}"
        )
    cov = (inputs.logp.detach() - stats.mean_logp) * (inputs.advantages - stats.mean_adv)
    return cov, stats


def _share(ratio: float, n_valid: int, what: str) -> int:
    if not 0 < ratio <= 1:
        raise ValueError(f"{what} must be in (0, 1], got {ratio}")
    return max(int(ratio * n_valid), 1) if n_valid > 0 else 0


@register_policy_loss("clip_cov", default_agg="token-mean", paper="Cui et al. 2505.22617 (Clip-Cov)")
def clip_cov(
    inputs: LossInputs,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    clip_cov_ratio: float = 2e-4,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    cov_stats: CovStats | None = None,
):
    """Clip-Cov: the grpo term, detached on a random share of tokens with cov in [lb, ub].

    Cui et al., "The Entropy Mechanism of RL for Reasoning LMs" (arXiv 2505.22617) Eq. 11-12:
    l = -min(r*A, clip(r)*A) except on a set S of max(1, int(clip_cov_ratio * n_valid)) tokens drawn uniformly
    at random among the valid tokens with clip_cov_lb <= cov <= clip_cov_ub, where l = sg[that term] (value kept,
    zero gradient; verl multiplies by 0 instead, which gives the same gradient but a different value).
    Following verl's implementation, tokens whose PPO clip is already active are not candidates. The draw uses
    ``generator`` if given, else a generator seeded with ``seed``, else torch's global RNG. Batch statistics
    are per call (module docstring). Metric ``cov_clip_frac``: |S| / n_valid.
    """
    check_eps(eps_low=eps_low, eps_high=eps_high)
    if clip_cov_lb > clip_cov_ub:
        raise ValueError(f"clip_cov_lb ({clip_cov_lb}) must be <= clip_cov_ub ({clip_cov_ub})")
    if seed is not None and generator is not None:
        raise ValueError("clip_cov: pass either seed or generator, not both")
    valid = inputs.mask
    ratio = torch.exp(token_log_ratio(inputs))
    term = clipped_surrogate(ratio, inputs.advantages, eps_low, eps_high)
    low, high = clip_masks(ratio, inputs.advantages, valid, eps_low, eps_high)
    cov, _ = _covariance(inputs, cov_stats)

    n_select = _share(clip_cov_ratio, int(valid.sum().item()), "clip_cov_ratio")
    candidates = valid & ~low & ~high & (cov >= clip_cov_lb) & (cov <= clip_cov_ub)
    flat = torch.nonzero(candidates.reshape(-1)).squeeze(-1)
    if generator is None and seed is not None:
        generator = torch.Generator().manual_seed(int(seed))
    perm_device = generator.device if generator is not None else torch.device("cpu")
    perm = torch.randperm(flat.numel(), generator=generator, device=perm_device).to(flat.device)
    selected = torch.zeros(candidates.numel(), dtype=torch.bool, device=candidates.device)
    selected[flat[perm[:n_select]]] = True
    selected = selected.view_as(candidates)

    loss_mat = torch.where(selected, term.detach(), term)
    metrics = clip_metrics(low, high, valid)
    metrics["cov_clip_frac"] = float(selected.sum().item()) / max(int(valid.sum().item()), 1)
    return loss_mat, metrics


@register_policy_loss("kl_cov", default_agg="token-mean", paper="Cui et al. 2505.22617 (KL-Cov)")
def kl_cov(
    inputs: LossInputs,
    *,
    kl_cov_ratio: float = 2e-4,
    kl_cov_coef: float = 1.0,
    cov_stats: CovStats | None = None,
):
    """KL-Cov: l = -r*A, plus kl_cov_coef * |logp - old| on the top kl_cov_ratio share of tokens by cov.

    Cui et al. (arXiv 2505.22617) Eq. 13: no ratio clipping; the k = max(1, int(kl_cov_ratio * n_valid)) valid
    tokens with the largest cov get the penalty coef*|log r|. Defaults as verl's kl_cov (kl_cov_ratio 2e-4,
    ppo_kl_coef 1.0, which is the paper's beta = 1). Batch statistics are per call (module docstring). Metrics:
    ``kl_cov_frac`` = k / n_valid and ``kl_cov_abs_kl`` = mean |log r| over valid tokens (verl's ppo_kl).
    """
    if not kl_cov_coef >= 0:
        raise ValueError(f"kl_cov_coef must be >= 0, got {kl_cov_coef}")
    valid = inputs.mask
    log_ratio = token_log_ratio(inputs)
    cov, _ = _covariance(inputs, cov_stats)
    n_valid = int(valid.sum().item())
    k = _share(kl_cov_ratio, n_valid, "kl_cov_ratio")
    scores = torch.where(valid, cov, torch.full((), float("-inf"), dtype=cov.dtype, device=cov.device))
    top = torch.topk(scores.reshape(-1), k).indices
    selected = torch.zeros(scores.numel(), dtype=torch.bool, device=scores.device)
    selected[top] = True
    selected = selected.view_as(scores) & valid

    penalty = kl_cov_coef * log_ratio.abs()
    loss_mat = -torch.exp(log_ratio) * inputs.advantages + torch.where(
        selected, penalty, torch.zeros_like(penalty)
    )
    none = torch.zeros_like(valid)
    metrics = clip_metrics(none, none, valid)
    metrics["kl_cov_frac"] = float(selected.sum().item()) / max(n_valid, 1)
    metrics["kl_cov_abs_kl"] = float(log_ratio.detach().abs().sum().item()) / max(n_valid, 1)
    return loss_mat, metrics


@register_policy_loss("cov_gauss", default_agg="token-mean", paper='"Taming Extreme Tokens" (2026)')
def cov_gauss(
    inputs: LossInputs,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    cov_stats: CovStats | None = None,
):
    """Gaussian covariance weighting: l = w * (-min(r*A, clip(r)*A)), w = sg[exp(-cov^2 / (2*sigma^2))].

    "Taming Extreme Tokens" (2026), as specified in ALGORITHMS.md (the paper is not in shared/papers): sigma is
    the population std (ddof 0) of cov over the valid tokens, no hyperparameter; tokens with extreme
    covariance are smoothly down-weighted. Our readings: w is a detached weight; when sigma = 0 (all cov
    equal, e.g. one token) w = 1; the clip range defaults to grpo's 0.2 / 0.2. Batch statistics are per call
    unless ``cov_stats`` is given (module docstring). Metric ``cov_weight_mean``: mean w over valid tokens.
    """
    check_eps(eps_low=eps_low, eps_high=eps_high)
    valid = inputs.mask
    ratio = torch.exp(token_log_ratio(inputs))
    cov, stats = _covariance(inputs, cov_stats)
    if stats.std_cov > 0:
        weight = torch.exp(-(cov**2) / (2.0 * stats.std_cov**2)).detach()
    else:
        weight = torch.ones_like(cov)
    loss_mat = weight * clipped_surrogate(ratio, inputs.advantages, eps_low, eps_high)
    low, high = clip_masks(ratio, inputs.advantages, valid, eps_low, eps_high)
    metrics = clip_metrics(low, high, valid)
    metrics["cov_weight_mean"] = float(torch.where(valid, weight, 0.0).sum().item()) / max(
        int(valid.sum().item()), 1
    )
    return loss_mat, metrics
