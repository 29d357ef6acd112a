"""The policy update of a step: ``ppo_epochs`` x mini-batches of gradient-accumulated micro-batches.

Exactness: each micro-batch's loss is normalised by its *mini-batch's* token and sequence counts, so accumulating
micro-batch gradients gives exactly the mini-batch gradient (see ``tepo.losses``). A non-finite loss or gradient
is never applied: the mini-batch is dropped and counted.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from tepo.losses import compute_policy_loss, mini_batch_stats, needs_mini_batch_stats
from tepo.losses._common import deferred_metrics, resolve_values
from tepo.losses.rollout_correction import (
    CorrectionTokens,
    rollout_correction_metrics,
    rollout_correction_tokens,
)
from tepo.rollout.base import RolloutBatch
from tepo.training.logprob_pass import LogprobSettings, held_attention, release_free_heap, rows_logprobs
from tepo.training.micro_batches import MicroBatchLayout, RowLengths, split_rows
from tepo.training.schedule import advance_schedule


@dataclass(frozen=True)
class UpdateSettings:
    loss: str
    loss_options: dict
    epochs: int
    mini_batch_groups: int  # prompts (groups of G rows) per optimizer update
    group_size: int
    max_grad_norm: float
    max_len: float  # rollout.max_new_tokens, for length-normalised aggregation modes


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
class RolloutCorrection:
    """A rollout-correction mode and its thresholds (``tepo.losses.rollout_correction``)."""

    mode: str
    options: dict


@dataclass(frozen=True)
class UpdatePlan:
    """How a run's updates are made, decided once by the trainer: the loss and its schedule (``settings``), how
    every log-prob pass is computed (``passes``, which holds the micro-batch layout), and ``correction``: a
    rollout correction to compute per micro-batch from the update's own forward pass (a mode that drops
    nothing, when there is no old-policy pass; with one, the step computes the weights once and hands them in
    :class:`RowTensors`)."""

    settings: UpdateSettings
    passes: LogprobSettings
    correction: RolloutCorrection | None = None

    @property
    def layout(self) -> MicroBatchLayout:
        return self.passes.layout


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


def _rows_logprobs_no_grad(
    model,
    batch: RolloutBatch,
    micro_batches: list[Tensor],
    positions: Tensor,
    settings: LogprobSettings,
    *,
    entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """The current policy's log-probs ``[M, T]`` of a mini-batch of M rows run as ``micro_batches``, each row at
    its ``positions[row]`` (its place in the mini-batch), and with ``entropy`` its per-token entropy (else None),
    without a graph."""
    size = sum(len(micro) for micro in micro_batches)
    out = ent_out = None
    for micro in micro_batches:
        logp, ent, cols = rows_logprobs(model, batch, micro, settings, entropy=entropy, grad=False)
        if out is None:  # float32, or float64 for a float64 model
            out = torch.zeros(size, batch.response_len, dtype=logp.dtype, device=batch.response_mask.device)
            ent_out = torch.zeros_like(out) if entropy else None
        out[positions[micro], cols] = logp
        if ent_out is not None:
            ent_out[positions[micro], cols] = ent
    return out, ent_out


@dataclass
class _MicroResult:
    """One micro-batch's values, still on the device until :func:`_read_once`."""

    finite: Tensor
    loss: Tensor
    tokens: Tensor
    entropy_sum: Tensor
    metrics: dict
    written: tuple | None  # (rows, cols) of token_entropy / token_logp written by this micro-batch


class _HostResults(list):
    grad_norm: float


def _read_once(pending: list[_MicroResult], grad_norm: Tensor) -> _HostResults:
    """Every micro-batch's flag, loss, counts and metrics, and the gradient norm, as python values in one read."""
    flat, keys = [grad_norm], []
    for r in pending:
        names = list(r.metrics)
        keys.append(names)
        flat.extend([r.finite, r.loss, r.tokens, r.entropy_sum, *(r.metrics[k] for k in names)])
    values = resolve_values(flat)
    out = _HostResults()
    out.grad_norm = values[0]
    i = 1
    for names in keys:
        finite, loss, tokens, entropy_sum = values[i : i + 4]
        metrics = dict(zip(names, values[i + 4 : i + 4 + len(names)]))
        i += 4 + len(names)
        out.append(
            {
                "finite": bool(finite),
                "loss": loss,
                "tokens": tokens,
                "entropy_sum": entropy_sum,
                "metrics": metrics,
            }
        )
    return out


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
) -> dict:
    """Run every optimizer update of one step; returns averaged loss metrics, ``update_padding_share`` (the share
    of the tokens the update's forward passes computed that were padding) and, as ``token_entropy`` and
    ``token_logp``, the epoch-0 (pre-update) policy's per-token entropy and log-probs ``[N, T]``; with
    ``plan.correction``, ``correction_metrics``: the metrics of the weights it computed, over the whole batch.

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
    current-policy log-probs (and entropy): ``old_logp`` / ``old_entropy`` for the step's first update, else a
    no-grad pass over the mini-batch at the current weights. Each micro-batch slices them by its rows' places
    in the mini-batch, so micro-batches of any rows in any order (a token budget sorts them by length) sum to
    the mini-batch's gradient.
    """
    settings, passes = plan.settings, plan.passes
    mask = tensors.mask
    n = mask.shape[0]
    needs_batch_stats = needs_mini_batch_stats(settings.loss, settings.loss_options)
    needs_entropy = settings.loss_options.get("top_entropy_quantile") is not None
    sums, counts = defaultdict(float), defaultdict(float)
    grad_norms, skipped, updates = [], 0, 0
    token_entropy = torch.zeros_like(mask)
    token_logp = torch.zeros_like(mask)
    correction = None  # plan.correction's per-token results of the whole batch, put together micro-batch by micro-batch
    # Read to the host once per step: the token budget's planner and the padding share both use them.
    lengths = RowLengths.of(batch)
    padded = [0, 0]  # (computed, real) tokens of the epoch-0 micro-batches, for update_padding_share
    schedule = minibatch_rows(
        n // settings.group_size,
        settings.group_size,
        epochs=settings.epochs,
        mini_batch_groups=settings.mini_batch_groups,
        generator=generator,
    )
    on_cpu = next(model.parameters()).device.type == "cpu"
    with held_attention(model, batch, passes):
        for epoch, rows in schedule:
            micro_batches = split_rows(rows, plan.layout, lengths)
            if epoch == 0:
                computed, real = lengths.padded_tokens(micro_batches)
                padded[0], padded[1] = padded[0] + computed, padded[1] + real
            # Each row's place in the mini-batch: where its values sit in the mini-batch statistics.
            positions = torch.empty(n, dtype=torch.long, device=rows.device)
            positions[rows] = torch.arange(len(rows), device=rows.device)
            num_tokens = float(mask[rows].sum().clamp(min=1))
            optimizer.zero_grad(set_to_none=True)
            stats = None
            if needs_batch_stats:
                first_update = updates + skipped == 0
                old_logp, old_entropy = tensors.old_logp, tensors.old_entropy
                if first_update and old_logp is not None and (old_entropy is not None or not needs_entropy):
                    current = old_logp[rows]
                    current_entropy = old_entropy[rows] if needs_entropy else None
                else:
                    current, current_entropy = _rows_logprobs_no_grad(
                        model, batch, micro_batches, positions, passes, entropy=needs_entropy
                    )
                mini = tensors.rows(rows)
                stats = mini_batch_stats(
                    settings.loss,
                    logp=current,
                    old_logp=current if mini.old_logp is None else mini.old_logp,
                    advantages=mini.advantages,
                    mask=mini.mask,
                    entropy=current_entropy,
                    rollout_logp=mini.rollout_logp,
                    **settings.loss_options,
                )
            # Nothing below reads a device value until the mini-batch's gradients are in: the loss metrics stay
            # on the device (deferred_metrics), the non-finite check is one flag per micro-batch, and all of them,
            # with the gradient norm, come to the host in one transfer per optimizer step. Each .item() would
            # otherwise wait for the GPU to drain its queue (about ten per micro-batch before).
            pending = []
            with deferred_metrics():
                for micro in micro_batches:
                    if on_cpu:
                        # glibc's heap only; on a GPU the activations live in CUDA's allocator and the trim
                        # would only cost host time between kernel launches.
                        release_free_heap()
                    logp, ent, cols = rows_logprobs(model, batch, micro, passes, entropy=True, grad=True)
                    if epoch == 0:
                        token_entropy[micro, cols] = ent.detach().float()
                        token_logp[micro, cols] = logp.detach().float()
                    part = tensors.rows(micro, cols)
                    m = part.mask
                    old = logp.detach() if part.old_logp is None else part.old_logp
                    old_ent = ent.detach() if part.old_entropy is None else part.old_entropy
                    token_weights = part.is_weights
                    if plan.correction is not None:
                        # Over the rows' response tokens, not only the loss's: the loss ignores the weights of the
                        # tokens it masks, and the step's metrics are over every response token (as with an
                        # old pass). A mode here drops nothing, so the loss mask needs no change.
                        tokens = rollout_correction_tokens(
                            old,
                            part.rollout_logp,
                            batch.response_mask[micro][:, cols],
                            mode=plan.correction.mode,
                            **plan.correction.options,
                        )
                        token_weights = tokens.weights
                        if epoch == 0:
                            correction = _place(correction, tokens, (micro, cols), mask.shape)
                    loss, metrics = compute_policy_loss(
                        settings.loss,
                        logp=logp,
                        old_logp=old,
                        advantages=part.advantages,
                        # bool: the same tokens, without the 0/1 check of a float mask (a GPU sync per call)
                        mask=m.bool(),
                        ref_logp=part.ref_logp,
                        entropy=ent,
                        old_entropy=old_ent,
                        num_tokens=num_tokens,
                        num_seqs=float(len(rows)),
                        max_len=settings.max_len,
                        is_weights=token_weights,
                        batch_stats=None if stats is None else stats.rows(positions[micro], cols),
                        rollout_logp=part.rollout_logp,
                        **settings.loss_options,
                    )
                    # A non-finite loss still runs its backward (its gradients are dropped with the step, below);
                    # only its flag is kept, so the check costs no sync here.
                    loss.backward()
                    pending.append(
                        _MicroResult(
                            finite=torch.isfinite(loss.detach()),
                            loss=loss.detach(),
                            tokens=m.sum(),
                            entropy_sum=(ent.detach() * m).sum(),
                            metrics=metrics,
                            written=(micro, cols) if epoch == 0 else None,
                        )
                    )
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), settings.max_grad_norm)
            host = _read_once(pending, grad_norm)
            # The step's micro-batches up to the first non-finite loss count, as when the loop stopped there.
            first_bad = next((i for i, r in enumerate(host) if not r["finite"]), None)
            finite = first_bad is None
            for r in host[: len(host) if finite else first_bad]:
                tokens = r["tokens"]
                sums["loss"] += r["loss"]
                for key, value in r["metrics"].items():
                    if isinstance(value, int | float) and key != "loss":
                        sums[key] += value * tokens
                        counts[key] += tokens
                sums["entropy_mean"] += r["entropy_sum"]
                counts["entropy_mean"] += tokens
            if not finite:
                # The loop used to stop at the first non-finite loss, leaving later rows' token views at 0.
                for r in pending[first_bad + 1 :]:
                    if r.written is not None:
                        token_entropy[r.written[0], r.written[1]] = 0.0
                        token_logp[r.written[0], r.written[1]] = 0.0
            norm = host.grad_norm
            if finite and math.isfinite(norm):
                grad_norms.append(norm)
                optimizer.step()
                updates += 1
                after_optimizer_step()
            else:
                skipped += 1
            # Free the spent (or rejected) gradients now rather than at the next zero_grad, so generation, the
            # checkpoint write and the weight sync of the next step run without 4 bytes per parameter idle.
            optimizer.zero_grad(set_to_none=True)
            advance_schedule(scheduler)
    out = {key: sums[key] / counts[key] for key in counts if counts[key] > 0}
    out["loss"] = sums["loss"] / max(updates, 1)
    out["grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else float("nan")
    out["grad_norm_max"] = max(grad_norms) if grad_norms else float("nan")
    out["optimizer_updates"] = updates
    out["skipped_updates"] = skipped
    if padded[0]:
        out["update_padding_share"] = 1.0 - padded[1] / padded[0]
    if correction is not None:
        out["correction_metrics"] = rollout_correction_metrics(correction, batch.response_mask)
    out["token_entropy"] = token_entropy
    out["token_logp"] = token_logp
    return out


def _place(
    whole: CorrectionTokens | None, part: CorrectionTokens, where: tuple, shape: torch.Size
) -> CorrectionTokens:
    """``whole`` (zeros and False where no micro-batch wrote yet, made on first use in ``part``'s dtype) with
    ``part`` written at ``where`` = (rows, cols): the whole batch's correction, for its metrics, computed once.

    Each token's weight comes from its own row only (token modes: its own ratio; sequence modes: its row's), so
    the assembled weights are those of one whole-batch call (bit for bit in token modes; in sequence modes up to
    the summation order of a row's log-ratios over its trimmed columns)."""
    if whole is None:
        weights = torch.zeros(shape, dtype=part.weights.dtype, device=part.weights.device)
        flags = torch.zeros(shape, dtype=torch.bool, device=part.weights.device)
        whole = CorrectionTokens(weights, flags, flags.clone())
    rows, cols = where
    whole.weights[rows, cols] = part.weights
    whole.keep[rows, cols] = part.keep
    whole.truncated[rows, cols] = part.truncated
    return whole
