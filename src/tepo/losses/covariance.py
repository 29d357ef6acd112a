"""Covariance-based losses (Cui et al. 2505.22617 and successors): clip_cov, kl_cov, cov_gauss.

All three score each valid token by ``cov[i,t] = (logp - mean logp) * (A - mean A)`` with the means taken over
the valid tokens, detached, and use batch statistics: the means, the population std of ``cov`` (cov_gauss), and
a share of tokens chosen among all valid ones (``max(1, int(ratio * n_valid))`` tokens: a random pick for
clip_cov, the top-k by cov for kl_cov).

**Over which tokens.** docs/algorithms.md specifies the optimizer mini-batch. Called alone, a loss computes every
statistic over the tokens of *that call*, which is what verl does (its ``compute_policy_loss_clip_cov`` /
``_kl_cov`` run once per micro-batch, so the share, the means and the pick all depend on the micro-batch size).
To get the mini-batch reading, compute the statistics once per optimizer mini-batch with
`tepo.losses.mini_batch_stats` (no gradient; the current policy's log-probs of the whole mini-batch) and pass
the result, sliced to each call's rows with `CovStats.rows`, as ``batch_stats=`` (or ``cov_stats=``) to every
micro-batch call: the sum of the micro-batch gradients is then exactly the gradient of one call on the
mini-batch, the chosen tokens included.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from tepo.losses._common import check_eps, clip_masks, clip_metrics, clipped_surrogate, token_log_ratio
from tepo.losses.inputs import LossInputs
from tepo.losses.registry import register_policy_loss


@dataclass(frozen=True, eq=False)
class CovStats:
    """Statistics of an optimizer mini-batch for the covariance losses (see `tepo.losses.mini_batch_stats`).

    ``selected`` ([rows, T] bool, or None) marks the tokens that ``loss`` (clip_cov: detached; kl_cov: penalised)
    chose over the whole mini-batch; `rows` slices it like the tensors of one micro-batch call.
    """

    mean_logp: float
    mean_adv: float
    std_cov: float
    selected: torch.Tensor | None = None
    loss: str = ""

    def rows(self, index: Any, cols: Any = None) -> CovStats:
        """The statistics for a call on ``tensor[index][:, cols]`` of the mini-batch tensors they were computed
        from (``index``: row positions within that mini-batch, e.g. a slice or an index tensor)."""
        if self.selected is None:
            return self
        selected = self.selected[index]
        if cols is not None:
            selected = selected[:, cols]
        return replace(self, selected=selected)


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


def _check_stats(cov_stats: Any) -> None:
    if cov_stats is not None and not isinstance(cov_stats, CovStats):
        raise ValueError(
            f"cov_stats must be a tepo.losses.CovStats (see mini_batch_stats), got {type(cov_stats).__name__}"
        )


def _covariance(inputs: LossInputs, cov_stats: CovStats | None) -> tuple[torch.Tensor, CovStats]:
    _check_stats(cov_stats)
    stats = cov_stats if cov_stats is not None else _stats_of(inputs.logp, inputs.advantages, inputs.mask)
    cov = (inputs.logp.detach() - stats.mean_logp) * (inputs.advantages - stats.mean_adv)
    return cov, stats


def _given_selection(stats: CovStats, inputs: LossInputs, name: str) -> torch.Tensor:
    """The chosen tokens of ``stats`` (the mini-batch's slice, or this call's own pick) for this call."""
    if stats.loss != name:
        raise ValueError(f"cov_stats were computed for policy loss {stats.loss!r}, not {name!r}")
    if stats.selected.shape != inputs.logp.shape:
        raise ValueError(
            f"cov_stats.selected has shape {tuple(stats.selected.shape)} but this call's tensors are "
            f"{tuple(inputs.logp.shape)}: slice the mini-batch statistics with cov_stats.rows(rows, cols)"
        )
    return stats.selected.to(device=inputs.mask.device, dtype=torch.bool) & inputs.mask


def _share(ratio: float, n_valid: int, what: str) -> int:
    if not 0 < ratio <= 1:
        raise ValueError(f"{what} must be in (0, 1], got {ratio}")
    return max(int(ratio * n_valid), 1) if n_valid > 0 else 0


def _check_clip_cov(clip_cov_lb: float, clip_cov_ub: float, seed, generator) -> None:
    if clip_cov_lb > clip_cov_ub:
        raise ValueError(f"clip_cov_lb ({clip_cov_lb}) must be <= clip_cov_ub ({clip_cov_ub})")
    if seed is not None and generator is not None:
        raise ValueError("clip_cov: pass either seed or generator, not both")


def _clip_cov_pick(
    inputs: LossInputs,
    cov: torch.Tensor,
    low: torch.Tensor,
    high: torch.Tensor,
    *,
    clip_cov_ratio: float,
    clip_cov_lb: float,
    clip_cov_ub: float,
    seed: int | None,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """S: max(1, int(ratio * n_valid)) tokens drawn uniformly among the valid, unclipped tokens with cov in band."""
    valid = inputs.mask
    n_select = _share(clip_cov_ratio, int(valid.sum().item()), "clip_cov_ratio")
    candidates = valid & ~low & ~high & (cov >= clip_cov_lb) & (cov <= clip_cov_ub)
    flat = torch.nonzero(candidates.reshape(-1)).squeeze(-1)
    if generator is None and seed is not None:
        generator = torch.Generator().manual_seed(int(seed))
    perm_device = generator.device if generator is not None else torch.device("cpu")
    perm = torch.randperm(flat.numel(), generator=generator, device=perm_device).to(flat.device)
    selected = torch.zeros(candidates.numel(), dtype=torch.bool, device=candidates.device)
    selected[flat[perm[:n_select]]] = True
    return selected.view_as(candidates)


def _kl_cov_pick(inputs: LossInputs, cov: torch.Tensor, *, kl_cov_ratio: float) -> torch.Tensor:
    """The k = max(1, int(ratio * n_valid)) valid tokens with the largest cov."""
    valid = inputs.mask
    k = _share(kl_cov_ratio, int(valid.sum().item()), "kl_cov_ratio")
    scores = torch.where(valid, cov, torch.full((), float("-inf"), dtype=cov.dtype, device=cov.device))
    top = torch.topk(scores.reshape(-1), k).indices
    selected = torch.zeros(scores.numel(), dtype=torch.bool, device=scores.device)
    selected[top] = True
    return selected.view_as(scores) & valid


def _clip_cov_batch_stats(
    inputs: LossInputs,
    *,
    eps_low: float,
    eps_high: float,
    clip_cov_ratio: float,
    clip_cov_lb: float,
    clip_cov_ub: float,
    seed: int | None,
    generator: torch.Generator | None,
    means: CovStats | None = None,
    **_: Any,
) -> CovStats:
    """S over ``inputs``' tokens (the one place clip_cov picks); cov from ``means`` if given, else their own."""
    check_eps(eps_low=eps_low, eps_high=eps_high)
    _check_clip_cov(clip_cov_lb, clip_cov_ub, seed, generator)
    cov, stats = _covariance(inputs, means)
    ratio = torch.exp(token_log_ratio(inputs)).detach()
    low, high = clip_masks(ratio, inputs.advantages, inputs.mask, eps_low, eps_high)
    selected = _clip_cov_pick(
        inputs,
        cov,
        low,
        high,
        clip_cov_ratio=clip_cov_ratio,
        clip_cov_lb=clip_cov_lb,
        clip_cov_ub=clip_cov_ub,
        seed=seed,
        generator=generator,
    )
    return replace(stats, selected=selected, loss="clip_cov")


def _kl_cov_batch_stats(
    inputs: LossInputs, *, kl_cov_ratio: float, means: CovStats | None = None, **_: Any
) -> CovStats:
    """The top-k over ``inputs``' tokens (the one place kl_cov picks); cov from ``means`` if given."""
    cov, stats = _covariance(inputs, means)
    return replace(stats, selected=_kl_cov_pick(inputs, cov, kl_cov_ratio=kl_cov_ratio), loss="kl_cov")


def _cov_gauss_batch_stats(inputs: LossInputs, **_: Any) -> CovStats:
    return replace(_stats_of(inputs.logp, inputs.advantages, inputs.mask), loss="cov_gauss")


@register_policy_loss(
    "clip_cov",
    default_agg="token-mean",
    paper="Cui et al. 2505.22617 (Clip-Cov)",
    batch_stats=_clip_cov_batch_stats,
    batch_stats_option="cov_stats",
)
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
    ``generator`` if given, else a generator seeded with ``seed``, else torch's global RNG. With ``cov_stats``
    from `tepo.losses.mini_batch_stats`, S is the mini-batch's (no draw here); without, it is drawn over this
    call's tokens (module docstring). Metric ``cov_clip_frac``: |S| / n_valid over this call's tokens.
    """
    check_eps(eps_low=eps_low, eps_high=eps_high)
    _check_clip_cov(clip_cov_lb, clip_cov_ub, seed, generator)
    _check_stats(cov_stats)
    if cov_stats is None or cov_stats.selected is None:
        # S is this call's, drawn by the same function as the mini-batch statistics draw theirs.
        cov_stats = _clip_cov_batch_stats(
            inputs,
            eps_low=eps_low,
            eps_high=eps_high,
            clip_cov_ratio=clip_cov_ratio,
            clip_cov_lb=clip_cov_lb,
            clip_cov_ub=clip_cov_ub,
            seed=seed,
            generator=generator,
            means=cov_stats,
        )
    else:
        _share(clip_cov_ratio, 1, "clip_cov_ratio")  # the option is still checked
    valid = inputs.mask
    ratio = torch.exp(token_log_ratio(inputs))
    term = clipped_surrogate(ratio, inputs.advantages, eps_low, eps_high)
    low, high = clip_masks(ratio, inputs.advantages, valid, eps_low, eps_high)
    selected = _given_selection(cov_stats, inputs, "clip_cov")

    loss_mat = torch.where(selected, term.detach(), term)
    metrics = clip_metrics(low, high, valid)
    metrics["cov_clip_frac"] = float(selected.sum().item()) / max(int(valid.sum().item()), 1)
    return loss_mat, metrics


@register_policy_loss(
    "kl_cov",
    default_agg="token-mean",
    paper="Cui et al. 2505.22617 (KL-Cov)",
    batch_stats=_kl_cov_batch_stats,
    batch_stats_option="cov_stats",
)
def kl_cov(
    inputs: LossInputs,
    *,
    kl_cov_ratio: float = 2e-4,
    kl_cov_coef: float = 1.0,
    cov_stats: CovStats | None = None,
):
    """KL-Cov: l = -r*A, plus kl_cov_coef * |logp - old| on the top kl_cov_ratio share of tokens by cov.

    Cui et al. (arXiv 2505.22617) Eq. 13: no ratio clipping; the k = max(1, int(kl_cov_ratio * n_valid)) valid
    tokens with the largest cov get the penalty coef*|log r|. Defaults kl_cov_ratio 2e-4 (verl's) and kl_cov_coef
    1.0 (the paper's beta = 1; verl's configured ppo_kl_coef is 0.1, its function's fallback 1.0 is never reached:
    verl's default = kl_cov_coef=0.1, tests/integrations/test_integration_verl_parity_more.py). With ``cov_stats`` from `tepo.losses.mini_batch_stats` the
    top-k is the mini-batch's; without, this call's (module docstring). Metrics: ``kl_cov_frac`` = penalised
    share of this call's valid tokens and ``kl_cov_abs_kl`` = mean |log r| over them (verl's ppo_kl).
    """
    if not kl_cov_coef >= 0:
        raise ValueError(f"kl_cov_coef must be >= 0, got {kl_cov_coef}")
    valid = inputs.mask
    log_ratio = token_log_ratio(inputs)
    _check_stats(cov_stats)
    if cov_stats is None or cov_stats.selected is None:
        # The top-k is this call's, chosen by the same function as the mini-batch statistics choose theirs.
        cov_stats = _kl_cov_batch_stats(inputs, kl_cov_ratio=kl_cov_ratio, means=cov_stats)
    else:
        _share(kl_cov_ratio, 1, "kl_cov_ratio")  # the option is still checked
    n_valid = int(valid.sum().item())
    selected = _given_selection(cov_stats, inputs, "kl_cov")

    penalty = kl_cov_coef * log_ratio.abs()
    loss_mat = -torch.exp(log_ratio) * inputs.advantages + torch.where(
        selected, penalty, torch.zeros_like(penalty)
    )
    none = torch.zeros_like(valid)
    metrics = clip_metrics(none, none, valid)
    metrics["kl_cov_frac"] = float(selected.sum().item()) / max(n_valid, 1)
    metrics["kl_cov_abs_kl"] = float(log_ratio.detach().abs().sum().item()) / max(n_valid, 1)
    return loss_mat, metrics


@register_policy_loss(
    "cov_gauss",
    default_agg="token-mean",
    paper='"Taming Extreme Tokens" (2026)',
    batch_stats=_cov_gauss_batch_stats,
    batch_stats_option="cov_stats",
)
def cov_gauss(
    inputs: LossInputs,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    cov_stats: CovStats | None = None,
):
    """Gaussian covariance weighting: l = w * (-min(r*A, clip(r)*A)), w = sg[exp(-cov^2 / (2*sigma^2))].

    "Taming Extreme Tokens" (2026), as read in docs/algorithms.md#cov_gauss (the paper was not available): sigma is
    the population std (ddof 0) of cov over the valid tokens, no hyperparameter; tokens with extreme
    covariance are smoothly down-weighted. Our readings: w is a detached weight; when sigma = 0 (all cov
    equal, e.g. one token) w = 1; the clip range defaults to grpo's 0.2 / 0.2. The means and sigma are this
    call's unless ``cov_stats`` (from `tepo.losses.mini_batch_stats`) gives the mini-batch's (module docstring).
    Metric ``cov_weight_mean``: mean w over valid tokens.
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
