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
from tepo.losses.rollout_correction import rollout_correction_weights
from tepo.rollout.base import RolloutBatch
from tepo.training.logprob_pass import LogprobSettings, held_attention, release_free_heap, rows_logprobs
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


def _rows_logprobs_no_grad(
    model, batch: RolloutBatch, rows: Tensor, settings: LogprobSettings, *, entropy: bool = False
) -> tuple[Tensor, Tensor | None]:
    """The current policy's log-probs ``[len(rows), T]`` of ``rows``, and with ``entropy`` its per-token entropy
    (else None), in micro-batches, without a graph."""
    out = torch.zeros(len(rows), batch.response_len, device=batch.response_mask.device)
    ent_out = torch.zeros_like(out) if entropy else None
    offset = 0
    for micro in rows.split(settings.micro_batch_size):
        logp, ent, cols = rows_logprobs(model, batch, micro, settings, entropy=entropy, grad=False)
        out[offset : offset + len(micro), cols] = logp.float()
        if ent_out is not None:
            ent_out[offset : offset + len(micro), cols] = ent.float()
        offset += len(micro)
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


def _columns(value: Tensor | None, micro: Tensor, cols: slice) -> Tensor | None:
    if value is None:
        return None
    value = value[micro]
    return value[:, cols] if value.dim() == 2 else value


def update_policy(
    model,
    optimizer: torch.optim.Optimizer,
    scheduler,
    batch: RolloutBatch,
    advantages: Tensor,
    settings: UpdateSettings,
    logprob_settings: LogprobSettings,
    *,
    old_logp: Tensor | None,
    old_entropy: Tensor | None,
    ref_logp: Tensor | None,
    generator: torch.Generator,
    after_optimizer_step: Callable[[], None] = lambda: None,
    loss_mask: Tensor | None = None,
    is_weights: Tensor | None = None,
    correction: RolloutCorrection | None = None,
) -> dict:
    """Run every optimizer update of one step; returns averaged loss metrics and, as ``token_entropy`` and
    ``token_logp``, the epoch-0 (pre-update) policy's per-token entropy and log-probs ``[N, T]``.

    ``old_logp`` / ``old_entropy`` None means the update's own (detached) forward pass is the old policy: exact
    when there is a single update per rollout. The LR schedule follows planned updates, applied or skipped, so the
    learning rate at a step depends on the step alone (as in verl and the transformers Trainer).

    Off-policy correction comes in one of two forms: precomputed ``is_weights`` with ``loss_mask`` (the response
    mask less the tokens the correction dropped, which leave the token counts too), when old log-probs exist
    before the update; or ``correction``, computed per micro-batch from the update's own forward pass, for modes
    that drop nothing. Either way a token's weight depends on its own row only, so micro-batching leaves the
    gradient unchanged.

    Losses whose statistics span the mini-batch (``spec.needs_batch_stats``: the covariance losses) and the
    batch-wide token selections (``top_entropy_quantile``, ``m2po_threshold``) get them from the mini-batch's
    current-policy log-probs (and entropy): ``old_logp`` / ``old_entropy`` for the step's first update, else a
    no-grad pass over the mini-batch at the current weights. The sampler's ``batch.rollout_logp``, when the
    backend returned it, reaches the loss as ``rollout_logp`` (the "behaviour" of DPPO, off_policy_mask, M2PO).
    """
    mask = batch.response_mask if loss_mask is None else loss_mask
    n = mask.shape[0]
    needs_batch_stats = needs_mini_batch_stats(settings.loss, settings.loss_options)
    needs_entropy = settings.loss_options.get("top_entropy_quantile") is not None
    sums, counts = defaultdict(float), defaultdict(float)
    grad_norms, skipped, updates = [], 0, 0
    token_entropy = torch.zeros_like(mask)
    token_logp = torch.zeros_like(mask)
    schedule = minibatch_rows(
        n // settings.group_size,
        settings.group_size,
        epochs=settings.epochs,
        mini_batch_groups=settings.mini_batch_groups,
        generator=generator,
    )
    with held_attention(model, batch, logprob_settings):
        for epoch, rows in schedule:
            num_tokens = float(mask[rows].sum().clamp(min=1))
            optimizer.zero_grad(set_to_none=True)
            stats = None
            if needs_batch_stats:
                first_update = updates + skipped == 0
                if first_update and old_logp is not None and (old_entropy is not None or not needs_entropy):
                    current = old_logp[rows]
                    current_entropy = old_entropy[rows] if needs_entropy else None
                else:
                    current, current_entropy = _rows_logprobs_no_grad(
                        model, batch, rows, logprob_settings, entropy=needs_entropy
                    )
                stats = mini_batch_stats(
                    settings.loss,
                    logp=current,
                    old_logp=current if old_logp is None else old_logp[rows],
                    advantages=advantages[rows],
                    mask=mask[rows],
                    entropy=current_entropy,
                    rollout_logp=_columns(batch.rollout_logp, rows, slice(None)),
                    **settings.loss_options,
                )
            # Nothing below reads a device value until the mini-batch's gradients are in: the loss metrics stay
            # on the device (deferred_metrics), the non-finite check is one flag per micro-batch, and all of them,
            # with the gradient norm, come to the host in one transfer per optimizer step. Each .item() would
            # otherwise wait for the GPU to drain its queue (about ten per micro-batch before).
            pending = []
            offset = 0
            on_cpu = next(model.parameters()).device.type == "cpu"
            with deferred_metrics():
                for micro in rows.split(logprob_settings.micro_batch_size):
                    if on_cpu:
                        # glibc's heap only; on a GPU the activations live in CUDA's allocator and the trim
                        # would only cost host time between kernel launches.
                        release_free_heap()
                    logp, ent, cols = rows_logprobs(
                        model, batch, micro, logprob_settings, entropy=True, grad=True
                    )
                    if epoch == 0:
                        token_entropy[micro, cols] = ent.detach().float()
                        token_logp[micro, cols] = logp.detach().float()
                    m = mask[micro][:, cols]
                    old = logp.detach() if old_logp is None else old_logp[micro][:, cols]
                    old_ent = ent.detach() if old_entropy is None else old_entropy[micro][:, cols]
                    token_weights = _columns(is_weights, micro, cols)
                    if correction is not None:
                        token_weights, _, _ = rollout_correction_weights(
                            old,
                            batch.rollout_logp[micro][:, cols],
                            m,
                            mode=correction.mode,
                            **correction.options,
                        )
                    part = slice(offset, offset + len(micro))  # the micro-batch's rows within the mini-batch
                    offset += len(micro)
                    loss, metrics = compute_policy_loss(
                        settings.loss,
                        logp=logp,
                        old_logp=old,
                        advantages=_columns(advantages, micro, cols),
                        # bool: the same tokens, without the 0/1 check of a float mask (a GPU sync per call)
                        mask=m.bool(),
                        ref_logp=_columns(ref_logp, micro, cols),
                        entropy=ent,
                        old_entropy=old_ent,
                        num_tokens=num_tokens,
                        num_seqs=float(len(rows)),
                        max_len=settings.max_len,
                        is_weights=token_weights,
                        batch_stats=None if stats is None else stats.rows(part, cols),
                        rollout_logp=_columns(batch.rollout_logp, micro, cols),
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
    out["token_entropy"] = token_entropy
    out["token_logp"] = token_logp
    return out
