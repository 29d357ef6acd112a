"""Options that keep the policy term on a subset of tokens, for any loss: off_policy_mask, top_entropy_quantile,
m2po_threshold (docs/algorithms.md#options-of-the-2026-objectives). Each is off (None) by default.

A dropped token's per-token term is replaced by 0 (``torch.where``: no gradient reaches it through that term) and
the token stays in the aggregation's counts, as TRL does; the regularizers (entropy bonus, KL to the reference)
are not affected. For a sequence-ratio loss a dropped token's own term goes, but the other tokens' terms of its
row still depend on its log-prob through ``s_i``. Every selection reads detached values.

Two of them choose among the tokens of the whole optimizer mini-batch (an entropy quantile, M2PO's largest second
moments): compute `SelectionStats` once per mini-batch (`tepo.losses.mini_batch_stats` does) and hand each
micro-batch call its slice, so micro-batching leaves the selection, and the gradient, unchanged. Without them a
call selects among its own tokens.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from typing import Any

import torch

from tepo.losses._common import behaviour_logp, masked_mean_value, row_lengths, sequence_advantage
from tepo.losses.inputs import LossInputs

SELECTION_OPTIONS: dict[str, Any] = {
    "off_policy_mask": None,
    "top_entropy_quantile": None,
    "m2po_threshold": None,
}
# The options whose selection is a statistic of the mini-batch.
BATCH_SELECTIONS = ("top_entropy_quantile", "m2po_threshold")


def check_selection_options(options: dict[str, Any]) -> None:
    """Refuse a value outside an option's domain (None = off is always allowed)."""
    for key in SELECTION_OPTIONS:
        value = options.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ValueError(f"{key} must be a finite number or None (off), got {value!r}")
    rho = options.get("top_entropy_quantile")
    if rho is not None and not 0 < rho <= 1:
        raise ValueError(f"top_entropy_quantile must be in (0, 1] (the share of tokens kept), got {rho}")
    tau = options.get("m2po_threshold")
    if tau is not None and not tau >= 0:
        raise ValueError(f"m2po_threshold must be >= 0, got {tau}")


def needs_selection_stats(options: dict[str, Any]) -> bool:
    """True when an active option selects among the tokens of the whole mini-batch."""
    return any(options.get(key) is not None for key in BATCH_SELECTIONS)


@dataclass(frozen=True, eq=False)
class SelectionStats:
    """The mini-batch's selections for the options in ``options`` (their values, to check a call uses the same).

    ``entropy_threshold``: keep tokens with H >= it (top_entropy_quantile). ``m2po_keep`` ([rows, T] bool): the
    tokens M2PO keeps; `rows` slices it like the tensors of one micro-batch call.
    """

    options: dict[str, Any]
    entropy_threshold: float | None = None
    m2po_keep: torch.Tensor | None = None

    def rows(self, index: Any, cols: Any = None) -> SelectionStats:
        if self.m2po_keep is None:
            return self
        keep = self.m2po_keep[index]
        if cols is not None:
            keep = keep[:, cols]
        return replace(self, m2po_keep=keep)


def _quantile(values: torch.Tensor, q: float) -> float:
    """``torch.quantile(values, q)`` (linear interpolation) by a sort, which has no input-size limit."""
    ordered = torch.sort(values.double()).values
    pos = q * (ordered.numel() - 1)
    lo = int(pos)
    hi = min(lo + 1, ordered.numel() - 1)
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))


def entropy_threshold(inputs: LossInputs, rho: float) -> float:
    """The (1 - rho) quantile of the entropy over the valid tokens (-inf when there are none: all kept)."""
    if inputs.entropy is None:
        raise ValueError(
            "top_entropy_quantile needs entropy, which was not given (pass entropy=<[N, T] tensor>)"
        )
    values = inputs.entropy.detach()[inputs.mask]
    return float("-inf") if values.numel() == 0 else _quantile(values, 1.0 - rho)


def m2po_keep(inputs: LossInputs, tau: float) -> torch.Tensor:
    """M2PO (arXiv 2510.01161, AReaL ``m2_threshold``): drop valid tokens in decreasing order of
    m = (logp - behaviour)^2 until the mean m of the kept ones is <= tau; returns the kept valid tokens.

    Ties are broken by position (a stable sort over the row-major order of the tensors given). When even the
    smallest m exceeds tau every token is dropped.
    """
    second = ((inputs.logp.detach() - behaviour_logp(inputs)) ** 2).double()
    flat_valid = inputs.mask.reshape(-1)
    values = second.reshape(-1)[flat_valid]
    keep = torch.zeros_like(flat_valid)
    n = values.numel()
    if n == 0:
        return keep.view_as(inputs.mask)
    order = torch.sort(values, descending=True, stable=True).indices
    ordered = values[order]
    # suffix_mean[k] = mean of ordered[k:], the kept tokens' mean after dropping the k largest; non-increasing.
    suffix = torch.flip(torch.cumsum(torch.flip(ordered, [0]), 0), [0])
    suffix_mean = suffix / torch.arange(n, 0, -1, dtype=suffix.dtype, device=suffix.device)
    ok = torch.nonzero(suffix_mean <= tau)
    drop = int(ok[0]) if ok.numel() else n
    kept_valid = torch.ones(n, dtype=torch.bool, device=keep.device)
    kept_valid[order[:drop]] = False
    keep[torch.nonzero(flat_valid).squeeze(-1)] = kept_valid
    return keep.view_as(inputs.mask)


def selection_stats(inputs: LossInputs, options: dict[str, Any]) -> SelectionStats:
    """`SelectionStats` over the tokens of ``inputs`` (the mini-batch) for the batch-wide options set."""
    chosen = {key: options.get(key) for key in BATCH_SELECTIONS}
    rho, tau = chosen["top_entropy_quantile"], chosen["m2po_threshold"]
    return SelectionStats(
        options=chosen,
        entropy_threshold=None if rho is None else entropy_threshold(inputs, rho),
        m2po_keep=None if tau is None else m2po_keep(inputs, tau),
    )


def _given(stats: SelectionStats | None, inputs: LossInputs, options: dict[str, Any]) -> SelectionStats:
    chosen = {key: options.get(key) for key in BATCH_SELECTIONS}
    if stats is None:
        return selection_stats(inputs, chosen)
    if stats.options != chosen:
        raise ValueError(
            f"batch_stats were computed for {stats.options} but this call has {chosen}: pass the same options "
            "to mini_batch_stats and compute_policy_loss"
        )
    if stats.m2po_keep is not None and stats.m2po_keep.shape != inputs.mask.shape:
        raise ValueError(
            f"batch_stats' m2po selection has shape {tuple(stats.m2po_keep.shape)} but this call's tensors are "
            f"{tuple(inputs.mask.shape)}: slice the mini-batch statistics with stats.rows(rows, cols)"
        )
    return stats


def select_tokens(
    inputs: LossInputs, options: dict[str, Any], stats: SelectionStats | None
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """The valid tokens whose policy term is kept (None when no option is on), and the selection metrics."""
    valid = inputs.mask
    if stats is not None and not needs_selection_stats(options):
        raise ValueError(
            f"batch_stats carry selections for {stats.options} but this call sets neither "
            f"{' nor '.join(BATCH_SELECTIONS)}: pass the same options to mini_batch_stats and compute_policy_loss"
        )
    keep, metrics = valid, {}
    delta = options.get("off_policy_mask")
    if delta is not None:
        # DeepSeek-V3.2 OPSM (arXiv 2512.02556 Eq. 9), TRL off_policy_mask_threshold: drop a negative-advantage
        # sequence whose mean behaviour-to-current log-ratio exceeds delta.
        drift = (behaviour_logp(inputs) - inputs.logp.detach()).sum(dim=-1) / row_lengths(inputs).clamp(min=1)
        dropped = (sequence_advantage(inputs) < 0) & (drift > delta) & valid.any(dim=-1)
        keep = keep & ~dropped.unsqueeze(-1)
        rows = valid.any(dim=-1)
        metrics["off_policy_mask_frac"] = masked_mean_value(dropped.float(), rows)
    if needs_selection_stats(options):
        stats = _given(stats, inputs, options)
        if stats.entropy_threshold is not None:
            high = inputs.entropy.detach() >= stats.entropy_threshold
            keep = keep & high
            metrics["top_entropy_kept_frac"] = masked_mean_value(high.float(), valid)
        if stats.m2po_keep is not None:
            m2 = stats.m2po_keep.to(device=valid.device, dtype=torch.bool) & valid
            keep = keep & m2
            metrics["m2po_drop_frac"] = masked_mean_value((~m2).float(), valid)
    if delta is None and not needs_selection_stats(options):
        return None, metrics
    return keep, metrics


@dataclass(frozen=True, eq=False)
class MiniBatchStats:
    """What `tepo.losses.mini_batch_stats` returns when a batch-wide selection option is on: the loss's own
    statistics (``loss``; None for a loss without ``spec.needs_batch_stats``) and the options' ``selection``."""

    loss: Any
    selection: SelectionStats

    def rows(self, index: Any, cols: Any = None) -> MiniBatchStats:
        loss = None if self.loss is None else self.loss.rows(index, cols)
        return MiniBatchStats(loss=loss, selection=self.selection.rows(index, cols))
