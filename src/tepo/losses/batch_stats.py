"""`mini_batch_stats`: the statistics a loss needs over a whole optimizer mini-batch, computed once.

Some losses (``spec.needs_batch_stats``: clip_cov, kl_cov, cov_gauss) and two token-selection options of any loss
(``top_entropy_quantile``, ``m2po_threshold``: `tepo.losses.token_selection`) depend on statistics of the batch
they score: means, a std, a share of tokens chosen among all valid ones, an entropy quantile. The trainer splits an optimizer mini-batch
into micro-batches for memory, so each call would otherwise see only its own rows. Per mini-batch::

    stats = mini_batch_stats(name, logp=logp_mb, old_logp=old_mb, advantages=adv_mb, mask=mask_mb, **options)
    for rows, cols in micro_batches:            # rows: positions within the mini-batch tensors above
        loss, _ = compute_policy_loss(name, ..., batch_stats=None if stats is None else stats.rows(rows, cols),
                                      num_tokens=..., **options)

gives, summed over micro-batches, exactly the gradient of one call on the mini-batch. ``logp_mb`` must be the
current policy's log-probabilities of the mini-batch (those the micro-batch calls will compute, detached): the
old-policy pass when this is the first update since it, else a no-grad pass at the current parameters.
"""

from __future__ import annotations

from typing import Any

import torch

from tepo.losses.compute import _split_options
from tepo.losses.inputs import prepare_inputs
from tepo.losses.registry import get_policy_loss
from tepo.losses.token_selection import MiniBatchStats, needs_selection_stats, selection_stats


def needs_mini_batch_stats(name: str, options: dict[str, Any]) -> bool:
    """True when loss ``name`` with ``options`` needs `mini_batch_stats` (its own statistics or a selection's)."""
    return get_policy_loss(name).needs_batch_stats or needs_selection_stats(options)


def mini_batch_stats(
    name: str,
    *,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    num_tokens: Any = None,
    entropy: torch.Tensor | None = None,
    rollout_logp: torch.Tensor | None = None,
    **options: Any,
) -> Any:
    """Statistics of the whole mini-batch for loss ``name`` with ``options``, or None when it needs none
    (`needs_mini_batch_stats`).

    ``logp`` (current policy, any grad is dropped), ``old_logp``, ``mask``: [N, T] over the mini-batch's rows;
    ``advantages`` [N] or [N, T]. ``options`` are those of `compute_policy_loss` (the same dict the trainer passes
    there, and ``num_tokens``; options that do not shape the statistics are accepted and ignored, unknown ones
    are rejected). The
    mask given here must be the one the micro-batch calls use (rollout-correction rejections already applied).
    The result's ``rows(index, cols)`` slices it for one micro-batch call. ``entropy`` (current policy, needed by
    ``top_entropy_quantile``) and ``rollout_logp`` (the behaviour policy of ``m2po_threshold``) are [N, T] like
    ``logp``. With a selection option on, the result is a `MiniBatchStats` (the loss's statistics, if any, and
    the selection's); otherwise the loss's own statistics object (e.g. `CovStats`).
    """
    del num_tokens  # a count for aggregation: no statistic depends on it
    spec = get_policy_loss(name)
    if spec.batch_stats_option is not None and spec.batch_stats_option in options:
        raise ValueError(f"mini_batch_stats computes {spec.batch_stats_option}; do not pass it")
    own, common = _split_options(spec, options)
    selecting = needs_selection_stats(common)
    if not spec.needs_batch_stats and not selecting:
        return None
    inputs = prepare_inputs(
        logp=logp.detach(),
        old_logp=old_logp,
        advantages=advantages,
        mask=mask,
        ref_logp=None,
        entropy=None if entropy is None else entropy.detach(),
        old_entropy=None,
        num_tokens=None,
        num_seqs=None,
        max_len=None,
        rollout_logp=rollout_logp,
    )
    with torch.no_grad():
        loss_stats = spec.batch_stats(inputs, **{**spec.defaults, **own}) if spec.needs_batch_stats else None
        if not selecting:
            return loss_stats
        return MiniBatchStats(loss=loss_stats, selection=selection_stats(inputs, common))
