"""The policy update of a step: ``ppo_epochs`` x mini-batches of gradient-accumulated micro-batches.

It executes an :class:`tepo.training.plan.UpdatePlan` (decided once by the trainer): for each mini-batch of the
schedule, the mini-batch statistics where the plan has them (:func:`_mini_batch_statistics`), one forward and
backward per micro-batch (:func:`_micro_step`), then one host read of every micro-batch's values and the
optimizer step, or its skip (``tepo.training.update_totals``). To add a loss: nothing here (``tepo.losses``); a pass: the
plan decides it, one function here runs it.

Exactness: each micro-batch's loss is normalised by its *mini-batch's* token and sequence counts, so accumulating
micro-batch gradients gives exactly the mini-batch gradient (see ``tepo.losses``). A non-finite loss or gradient
is never applied: the mini-batch is dropped and counted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from tepo.losses import mini_batch_stats
from tepo.losses._common import deferred_metrics
from tepo.losses.rollout_correction import (
    CorrectionTokens,
    rollout_correction_tokens,
)
from tepo.rollout.base import RolloutBatch
from tepo.training.logprob_pass import LogprobSettings, held_attention, release_free_heap, rows_logprobs
from tepo.training.micro_batches import RowLengths, split_rows
from tepo.training.plan import RolloutCorrection, UpdatePlan
from tepo.training.schedule import advance_schedule
from tepo.training.update_totals import MicroResult, UpdateResult, UpdateTotals, place, read_once

__all__ = ["RowTensors", "UpdateResult", "minibatch_rows", "update_policy"]


def minibatch_rows(
    num_groups: int, group_size: int, *, epochs: int, mini_batch_groups: int, generator: torch.Generator
) -> Iterator[tuple[int, Tensor]]:
    """``(epoch, rows)`` of every optimizer update: whole groups, shuffled between epochs as verl/DAPO do.

    One epoch keeps rollout order (and draws nothing from ``generator``); several epochs draw one permutation of
    the groups per epoch. A group's G rows always stay together in one mini-batch.
    """
    for epoch in range(epochs):
        order = torch.randperm(num_groups, generator=generator) if epochs > 1 else torch.arange(num_groups)
        for group_ids in order.split(mini_batch_groups):
            yield epoch, (group_ids[:, None] * group_size + torch.arange(group_size)).reshape(-1)


@dataclass(frozen=True)
class RowTensors:
    """Every per-row tensor the loss may read, ``[N]`` or ``[N, T]`` over the step's rows, sliced together.

    ``mask``: the loss mask (the response mask less truncated rows under overlong filtering and tokens a
    rollout correction dropped: they leave the token counts too). ``old_logp`` / ``old_entropy`` None: the
    update's own detached forward pass is the old policy (exact for a single update per rollout).
    ``is_weights``: the correction's per-token weights, computed once per step from the old-policy pass.
    ``rollout_logp``: the sampler's log-probs (the behaviour policy of DPPO, off_policy_mask, M2PO).
    """

    advantages: Tensor
    mask: Tensor
    old_logp: Tensor | None = None
    old_entropy: Tensor | None = None
    ref_logp: Tensor | None = None
    is_weights: Tensor | None = None
    rollout_logp: Tensor | None = None

    def rows(self, index, cols: slice = slice(None)) -> RowTensors:
        """The rows ``index`` (and of ``[N, T]`` tensors the columns ``cols``), as `MiniBatchStats.rows` slices."""

        def cut(value: Tensor | None) -> Tensor | None:
            if value is None:
                return None
            value = value[index]
            return value[:, cols] if value.dim() == 2 else value

        return RowTensors(**{name: cut(getattr(self, name)) for name in self.__dataclass_fields__})


@dataclass(frozen=True)
class _MiniBatch:
    """One optimizer update's rows, run as ``micro_batches``; ``positions[row]``: a row's place in the mini-batch
    (where its values sit in the mini-batch statistics); ``num_tokens``: the loss mask's tokens, the count every
    micro-batch's loss is normalised by."""

    epoch: int
    rows: Tensor
    micro_batches: list[Tensor]
    positions: Tensor
    num_tokens: float

    @staticmethod
    def of(epoch: int, rows: Tensor, plan: UpdatePlan, lengths: RowLengths, mask: Tensor) -> _MiniBatch:
        positions = torch.empty(mask.shape[0], dtype=torch.long, device=rows.device)
        positions[rows] = torch.arange(len(rows), device=rows.device)
        return _MiniBatch(
            epoch=epoch,
            rows=rows,
            micro_batches=split_rows(rows, plan.layout, lengths),
            positions=positions,
            num_tokens=float(mask[rows].sum().clamp(min=1)),
        )


def _rows_logprobs_no_grad(
    model, batch: RolloutBatch, mini: _MiniBatch, settings: LogprobSettings, *, entropy: bool = False
) -> tuple[Tensor, Tensor | None]:
    """The current policy's log-probs ``[M, T]`` of the mini-batch's M rows, run as its micro-batches, each row
    at its place in the mini-batch, and with ``entropy`` its per-token entropy (else None), without a graph."""
    size = sum(len(micro) for micro in mini.micro_batches)
    out = ent_out = None
    for micro in mini.micro_batches:
        (logp, ent, _), cols = rows_logprobs(model, batch, micro, settings, entropy=entropy, grad=False)
        if out is None:  # float32, or float64 for a float64 model
            out = torch.zeros(size, batch.response_len, dtype=logp.dtype, device=batch.response_mask.device)
            ent_out = torch.zeros_like(out) if entropy else None
        out[mini.positions[micro], cols] = logp
        if ent_out is not None:
            ent_out[mini.positions[micro], cols] = ent
    return out, ent_out


def _mini_batch_statistics(
    model, batch: RolloutBatch, tensors: RowTensors, plan: UpdatePlan, mini: _MiniBatch, *, first_update: bool
):
    """The mini-batch's statistics (``tepo.losses.mini_batch_stats``) where the plan has them
    (:attr:`UpdatePlan.stats`), else None: from the current policy's log-probs (and entropy), which are the
    old-policy pass's for the step's first update (the plan's rule) and a no-grad pass at the current weights
    otherwise."""
    need = plan.stats
    if need is None:
        return None
    settings = plan.settings
    old_logp, old_entropy = tensors.old_logp, tensors.old_entropy
    if need.reads_old_pass(
        first_update=first_update, old_logp=old_logp is not None, old_entropy=old_entropy is not None
    ):
        current = old_logp[mini.rows]
        current_entropy = old_entropy[mini.rows] if need.entropy else None
    else:
        current, current_entropy = _rows_logprobs_no_grad(
            model, batch, mini, plan.passes, entropy=need.entropy
        )
    rows = tensors.rows(mini.rows)
    return mini_batch_stats(
        settings.loss,
        logp=current,
        old_logp=current if rows.old_logp is None else rows.old_logp,
        advantages=rows.advantages,
        mask=rows.mask,
        entropy=current_entropy,
        rollout_logp=rows.rollout_logp,
        **settings.loss_options,
    )


def update_policy(
    model,
    optimizer: torch.optim.Optimizer,
    scheduler,
    batch: RolloutBatch,
    tensors: RowTensors,
    plan: UpdatePlan,
    *,
    generator: torch.Generator,
    after_optimizer_step: Callable[[], None] = lambda: None,
) -> UpdateResult:
    """Run every optimizer update of one step; returns its metrics and the pre-update policy's per-token views
    (:class:`UpdateResult`).

    ``tensors`` holds every per-row tensor (:class:`RowTensors`); ``plan`` the loss, the passes' numerics and
    micro-batch layout, and an in-loop rollout correction (:class:`UpdatePlan`). The LR schedule follows planned
    updates, applied or skipped, so the learning rate at a step depends on the step alone (as in verl and the
    transformers Trainer).

    Off-policy correction comes in one of two forms: ``tensors.is_weights`` with ``tensors.mask`` already less
    the tokens the correction dropped, when old log-probs exist before the update; or ``plan.correction``,
    computed per micro-batch from the update's own forward pass, for modes that drop nothing (each token's
    weight once per step: the metrics are taken from the weights put back together, not from a second call).
    Either way a token's weight depends on its own row only, so the micro-batch layout leaves the gradient
    unchanged.

    Losses whose statistics span the mini-batch (``spec.needs_batch_stats``: the covariance losses) and the
    batch-wide token selections (``top_entropy_quantile``, ``m2po_threshold``) get them from the mini-batch's
    current-policy log-probs (and entropy), as the plan's :class:`tepo.training.plan.MiniBatchStatsPass` says.
    Each micro-batch slices them by its rows' places in the mini-batch, so micro-batches of any rows in any
    order (a token budget sorts them by length) sum to the mini-batch's gradient.
    """
    settings = plan.settings
    mask = tensors.mask
    totals = UpdateTotals(token_entropy=torch.zeros_like(mask), token_logp=torch.zeros_like(mask))
    # Read to the host once per step: the token budget's planner and the padding share both use them.
    lengths = RowLengths.of(batch)
    schedule = minibatch_rows(
        mask.shape[0] // settings.group_size,
        settings.group_size,
        epochs=settings.epochs,
        mini_batch_groups=settings.mini_batch_groups,
        generator=generator,
    )
    on_cpu = next(model.parameters()).device.type == "cpu"
    with held_attention(model, batch, plan.passes):
        for epoch, rows in schedule:
            mini = _MiniBatch.of(epoch, rows, plan, lengths, mask)
            if epoch == 0:
                computed, real = lengths.padded_tokens(mini.micro_batches)
                totals.computed_tokens += computed
                totals.real_tokens += real
            optimizer.zero_grad(set_to_none=True)
            stats = _mini_batch_statistics(
                model, batch, tensors, plan, mini, first_update=totals.attempts == 0
            )
            # Nothing below reads a device value until the mini-batch's gradients are in: the loss metrics stay
            # on the device (deferred_metrics), the non-finite check is one flag per micro-batch, and all of them,
            # with the gradient norm, come to the host in one transfer per optimizer step. Each .item() would
            # otherwise wait for the GPU to drain its queue (about ten per micro-batch before).
            with deferred_metrics():
                pending = [
                    _micro_step(model, batch, tensors, plan, mini, micro, stats, totals, on_cpu=on_cpu)
                    for micro in mini.micro_batches
                ]
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), settings.max_grad_norm)
            if totals.fold(pending, read_once(pending, grad_norm)):
                optimizer.step()
                after_optimizer_step()
            # Free the spent (or rejected) gradients now rather than at the next zero_grad, so generation, the
            # checkpoint write and the weight sync of the next step run without 4 bytes per parameter idle.
            optimizer.zero_grad(set_to_none=True)
            advance_schedule(scheduler)
    return totals.result(batch)


def _micro_step(
    model,
    batch: RolloutBatch,
    tensors: RowTensors,
    plan: UpdatePlan,
    mini: _MiniBatch,
    micro: Tensor,
    stats,
    totals: UpdateTotals,
    *,
    on_cpu: bool,
) -> MicroResult:
    """One micro-batch: its forward pass with a graph, its loss (normalised by the mini-batch's counts) and the
    backward that accumulates its gradient; its values stay on the device. Epoch 0 also writes the pre-update
    token views and the in-loop correction's tokens into ``totals``."""
    if on_cpu:
        # glibc's heap only; on a GPU the activations live in CUDA's allocator and the trim would only cost host
        # time between kernel launches.
        release_free_heap()
    (logp, ent, _), cols = rows_logprobs(model, batch, micro, plan.passes, entropy=True, grad=True)
    first_epoch = mini.epoch == 0
    if first_epoch:
        totals.token_entropy[micro, cols] = ent.detach().float()
        totals.token_logp[micro, cols] = logp.detach().float()
    part = tensors.rows(micro, cols)
    old = logp.detach() if part.old_logp is None else part.old_logp
    old_ent = ent.detach() if part.old_entropy is None else part.old_entropy
    token_weights = part.is_weights
    if plan.correction is not None:
        tokens = _in_loop_correction(plan.correction, old, part, batch.response_mask[micro][:, cols])
        token_weights = tokens.weights
        if first_epoch:
            totals.correction = place(totals.correction, tokens, (micro, cols), tensors.mask.shape)
    loss, metrics = plan.loss(
        logp=logp,
        old_logp=old,
        advantages=part.advantages,
        # bool: the same tokens, without the 0/1 check of a float mask (a GPU sync per call)
        mask=part.mask.bool(),
        ref_logp=part.ref_logp,
        entropy=ent,
        old_entropy=old_ent,
        num_tokens=mini.num_tokens,
        num_seqs=float(len(mini.rows)),
        is_weights=token_weights,
        batch_stats=None if stats is None else stats.rows(mini.positions[micro], cols),
        rollout_logp=part.rollout_logp,
    )
    # A non-finite loss still runs its backward (its gradients are dropped with the step, by UpdateTotals.fold);
    # only its flag is kept, so the check costs no sync here.
    loss.backward()
    return MicroResult(
        finite=torch.isfinite(loss.detach()),
        loss=loss.detach(),
        tokens=part.mask.sum(),
        entropy_sum=(ent.detach() * part.mask).sum(),
        metrics=metrics,
        written=(micro, cols) if first_epoch else None,
    )


def _in_loop_correction(
    correction: RolloutCorrection, old_logp: Tensor, part: RowTensors, response_mask: Tensor
) -> CorrectionTokens:
    """The rollout correction of a micro-batch from the update's own (detached) forward pass. Over the rows'
    response tokens, not only the loss's: the loss ignores the weights of the tokens it masks, and the step's
    metrics are over every response token (as with an old pass). A mode here drops nothing, so the loss mask
    needs no change."""
    return rollout_correction_tokens(
        old_logp, part.rollout_logp, response_mask, mode=correction.mode, **correction.options
    )
