"""STARE (arXiv 2606.19236): while the batch entropy is below a target, the most surprising tokens of each
advantage sign get their clipped term reweighted.

From the open pull request TRL #6167 (head ``22337c6153449fec1064e2eb23c1fc1c33842490``,
``GRPOTrainer.compute_stare_token_weights`` and the ``loss_type == "stare"`` branch of ``_compute_loss``), with
options for the authors' own code (``hp-luo/STARE`` ``compute_policy_loss_stare``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch

from tepo.losses._common import (
    check_eps,
    check_range,
    clip_masks,
    clip_metrics,
    masked_mean_value,
    optional_number,
    token_log_ratio,
)
from tepo.losses.inputs import LossInputs
from tepo.losses.registry import register_policy_loss

VARIANTS = ("O1", "C2")
K_ROUNDINGS = ("ceil", "authors")
_LOG_RATIO_CLAMP = 20.0  # the authors' (verl's) clamp, applied with their dual clip


@dataclass(frozen=True, eq=False)
class StareStats:
    """A mini-batch's STARE selection (``positive`` / ``negative``: [rows, T] bool) and its batch entropy."""

    positive: torch.Tensor
    negative: torch.Tensor
    batch_entropy: float

    def rows(self, index: Any, cols: Any = None) -> StareStats:
        positive, negative = self.positive[index], self.negative[index]
        if cols is not None:
            positive, negative = positive[:, cols], negative[:, cols]
        return replace(self, positive=positive, negative=negative)


def _k(n: int, p: float, rounding: str) -> int:
    if n == 0 or p == 0:
        return 0
    want = math.ceil(n * p) if rounding == "ceil" else int(n * p + 0.999999)
    return min(n, max(1, want))


def _top_surprisal(
    candidates: torch.Tensor, surprisal: torch.Tensor, p: float, rounding: str
) -> torch.Tensor:
    """The ``k`` candidates of largest surprisal, ties to the lower flat index (a stable descending sort)."""
    k = _k(int(candidates.sum().item()), p, rounding)
    chosen = torch.zeros(candidates.numel(), dtype=torch.bool, device=candidates.device)
    if k > 0:
        fill = torch.full((), float("-inf"), dtype=surprisal.dtype, device=surprisal.device)
        scores = torch.where(candidates, surprisal, fill).flatten()
        chosen[torch.sort(scores, descending=True, stable=True).indices[:k]] = True
    return chosen.view_as(candidates)


def _check_stare(o: dict) -> None:
    if o["variant"] not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {o['variant']!r}")
    if o["k_rounding"] not in K_ROUNDINGS:
        raise ValueError(f"k_rounding must be one of {', '.join(K_ROUNDINGS)}, got {o['k_rounding']!r}")
    check_range("p", o["p"], low=0.0, high=1.0)
    check_range("W", o["W"], low=1.0)
    check_range("M", o["M"], low=0.0, high=1.0, open_low=True)
    check_eps(eps_low=o["eps_low"], eps_high=o["eps_high"])
    for name in ("delta", "dual_clip"):
        if optional_number(name, o[name]) is not None:
            check_range(name, o[name], low=1.0, open_low=True)
    optional_number("batch_entropy", o["batch_entropy"])


def _own_batch_entropy(inputs: LossInputs) -> float:
    if inputs.entropy is None:
        raise ValueError("policy loss 'stare' needs entropy (or batch_entropy=<float>), which was not given")
    count = int(inputs.mask.sum().item())
    return float(inputs.entropy.detach().sum().item() / count) if count else 0.0


def stare_selection(inputs: LossInputs, **options) -> StareStats:
    """The mini-batch statistics of stare: its selections and batch entropy (`tepo.losses.mini_batch_stats`)."""
    options.pop("selection", None)
    _check_stare(options)
    surprisal = -inputs.logp.detach()
    valid, adv = inputs.mask, inputs.advantages
    positive = _top_surprisal(valid & (adv > 0), surprisal, options["p"], options["k_rounding"])
    negative = torch.zeros_like(positive)
    if options["variant"] == "C2":
        negative = _top_surprisal(valid & (adv < 0), surprisal, options["p"], options["k_rounding"])
    given = options["batch_entropy"]
    entropy = float(given) if given is not None else _own_batch_entropy(inputs)
    return StareStats(positive, negative, entropy)


def _surrogate(inputs: LossInputs, eps_low, eps_high, delta, dual_clip) -> tuple[torch.Tensor, torch.Tensor]:
    log_ratio = token_log_ratio(inputs)
    if dual_clip is not None:
        log_ratio = log_ratio.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    adv = inputs.advantages
    capped = ratio if delta is None else ratio.clamp(max=delta)
    term = torch.maximum(-adv * capped, -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high))
    if dual_clip is not None:
        term = torch.where(adv < 0, torch.minimum(term, -dual_clip * adv), term)
    return term, ratio.detach()


@register_policy_loss(
    "stare",
    default_agg="token-mean",
    paper="STARE 2606.19236 (open PR: TRL #6167 @22337c61; hp-luo/STARE)",
    requires=("entropy",),
    batch_stats=stare_selection,
    batch_stats_option="selection",
)
def stare(
    inputs: LossInputs,
    *,
    variant: str = "O1",
    p: float = 0.1,
    W: float = 1.1,
    M: float = 0.9,
    H_tgt: float = 0.3,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    delta: float | None = None,
    dual_clip: float | None = None,
    batch_entropy: float | None = None,
    k_rounding: str = "ceil",
    selection: StareStats | None = None,
):
    """STARE: l = omega * max(-A min(r, delta), -A clip(r, 1-eps_low, 1+eps_high)), omega = W on the top-p
    surprisal tokens with A > 0 (and M on those with A < 0, variant C2) while the batch entropy is below H_tgt.

    STARE (arXiv 2606.19236), as TRL #6167 computes it. ``r = exp(logp - old)``; gate ``on = [H_bar < H_tgt]``
    with ``H_bar`` the mean entropy of the valid tokens (TRL: the micro-batch's current-policy entropy; here the
    mini-batch's through ``mini_batch_stats``, or ``batch_entropy=`` as given, the authors' step-level old-policy
    entropy). Among the valid tokens with A > 0 (and A < 0), the ``k = min(n, max(1, ceil(n p)))`` of largest
    surprisal ``-logp`` (ties: lower flat index) get ``omega = W`` (and ``M``), all others 1; omega, the selection
    and the gate are detached. ``dual_clip=c`` caps the term at ``-c A`` where ``A < 0`` (log-ratio clamped at
    +-20), ``k_rounding="authors"`` takes ``int(n p + 0.999999)``: the authors' code is
    ``stare(dual_clip=3.0, batch_entropy=H_bar, k_rounding="authors")``. Defaults TRL's: O1, p 0.1, W 1.1,
    M 0.9, H_tgt 0.3, eps 0.2/0.2, no delta, no dual clip. Without ``mini_batch_stats`` a call selects among its
    own tokens (TRL's per-micro-batch selection).

    Metrics: ``stare_gate_on``, ``stare_batch_entropy``, ``stare_positive_reweight_ratio`` /
    ``stare_negative_reweight_ratio`` (selected tokens over valid tokens, whether the gate is on or not),
    ``stare_mean_weight`` (mean omega), ``clip_frac_low`` / ``clip_frac_high``.
    """
    options = {
        "variant": variant, "p": p, "W": W, "M": M, "H_tgt": H_tgt, "eps_low": eps_low, "eps_high": eps_high,
        "delta": delta, "dual_clip": dual_clip, "batch_entropy": batch_entropy, "k_rounding": k_rounding,
    }  # fmt: skip
    if selection is None:
        selection = stare_selection(inputs, **options)
    else:
        _check_stare(options)
        if not isinstance(selection, StareStats):
            raise ValueError(
                f"selection must be a StareStats from mini_batch_stats, got {type(selection).__name__}"
            )
    valid = inputs.mask
    gate = selection.batch_entropy < H_tgt
    omega = torch.ones_like(inputs.logp)
    if gate:
        omega = torch.where(selection.positive & valid, W, torch.where(selection.negative & valid, M, omega))
    term, ratio = _surrogate(inputs, eps_low, eps_high, delta, dual_clip)
    low, high = clip_masks(ratio, inputs.advantages, valid, eps_low, eps_high)
    metrics = {
        **clip_metrics(low, high, valid),
        "stare_gate_on": float(gate),
        "stare_batch_entropy": selection.batch_entropy,
        "stare_positive_reweight_ratio": masked_mean_value(selection.positive.float(), valid),
        "stare_negative_reweight_ratio": masked_mean_value(selection.negative.float(), valid),
        "stare_mean_weight": masked_mean_value(omega, valid),
    }
    return omega * term, metrics
