"""Log-prob passes of a model over a rollout batch: micro-batched, column-trimmed, one attention kernel per batch.

Used by the old/reference passes (no grad, whole batch) and by the update (with grad, one micro-batch at a time).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from tepo.batch import trim_columns
from tepo.device import autocast_device_type
from tepo.logprobs import TokenLogprobs, response_logprobs
from tepo.models import attention_implementation, training_attention
from tepo.rollout.base import RolloutBatch
from tepo.training.micro_batches import MicroBatchLayout, RowLengths, split_rows


def bf16_autocast(enabled: bool, device_type: str = "cpu"):
    """bf16 autocast for the log-prob passes, without autocast's weight-cast cache.

    The cache keeps the bf16 copy of every weight until the autocast region ends, i.e. a whole model's worth at
    the end of each forward. A log-prob pass uses each layer's weights once (checkpoint recomputation runs in a
    region of its own), so without the cache each copy is freed after its layer: the same values, less memory.
    (HF generate keeps the cache: it reuses the weights at every token.) ``device_type``: that of the batch's
    tensors (``tepo.device.autocast_device_type``): the same bf16 autocast on CUDA as on the CPU.
    """
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=torch.bfloat16, cache_enabled=False)


@functools.cache
def _glibc_malloc_trim():
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to do
        return None


def release_free_heap() -> None:
    """Give the heap's free pages back to the OS (glibc ``malloc_trim``).

    glibc keeps freed mid-sized blocks (a layer's activations) in its heaps, so resident memory grows past what
    is alive; trimming before each micro-batch lowers the peak at no measurable cost (docs/performance.md).
    """
    trim = _glibc_malloc_trim()
    if trim is not None:
        trim(0)


@dataclass(frozen=True)
class LogprobSettings:
    """How every log-prob pass of a run is computed (the same numerics for old, reference and update passes)."""

    micro_batch_size: int
    temperature: float
    autocast_bf16: bool
    share_prompt_prefix: bool
    train_attention: str
    # train.micro_batch_tokens: a padded-area budget per micro-batch, rows sorted by length
    # (tepo.training.micro_batches); None: micro_batch_size rows in rollout order. One key for the update and the
    # no-grad passes, as micro_batch_size is.
    micro_batch_tokens: int | None = None

    @property
    def layout(self) -> MicroBatchLayout:
        return MicroBatchLayout(rows=self.micro_batch_size, tokens=self.micro_batch_tokens)


def held_attention(model, batch: RolloutBatch, settings: LogprobSettings):
    """The attention kernel for every log-prob pass over ``batch`` (see ``model.train_attention``).

    Chosen once for the whole batch and held through the backward passes: activation checkpointing recomputes
    each layer in backward, and the recomputation must run the kernel the forward ran.
    """
    width = batch.input_ids.shape[1]  # micro-batches are trimmed to at most this
    return attention_implementation(model, training_attention(model, settings.train_attention, width))


def rows_logprobs(
    model,
    batch: RolloutBatch,
    rows: Tensor,
    settings: LogprobSettings,
    *,
    entropy: bool,
    grad: bool,
    sum_pi_squared: bool = False,
) -> tuple[TokenLogprobs, slice]:
    """Log-probs (and entropy, and without a graph ``sum_pi_squared`` where asked) of the response tokens of
    ``rows``, trimmed to the columns those rows use.

    Returns ``(values, cols)``: ``cols`` slices ``[N, T]`` tensors (masks, advantages) the same way.
    """
    ids, att, t, cols = trim_columns(batch.input_ids[rows], batch.attention_mask[rows], batch.response_len)
    groups = batch.prompt_index[rows] if settings.share_prompt_prefix else None
    autocast = bf16_autocast(settings.autocast_bf16, autocast_device_type(ids.device))
    with torch.set_grad_enabled(grad), autocast:
        values = response_logprobs(
            model,
            ids,
            att,
            t,
            compute_entropy=entropy,
            temperature=settings.temperature,
            prompt_groups=groups,
            compute_sum_pi_squared=sum_pi_squared,
        )
    return values, cols


def batch_logprobs(
    model, batch: RolloutBatch, settings: LogprobSettings, *, entropy: bool, sum_pi_squared: bool = False
) -> TokenLogprobs:
    """No-grad log-probs (and entropy) of every response token, in micro-batches, padded to ``[N, T]``.

    With ``sum_pi_squared=True`` also ``sum_v pi(v)^2`` per position (for estimators that declare
    ``sum_pi_squared``, the optimal token baseline)."""
    n, t = batch.response_mask.shape
    device = batch.response_mask.device
    out = TokenLogprobs(
        logp=torch.zeros(n, t, device=device),
        entropy=torch.zeros(n, t, device=device) if entropy else None,
        sum_pi_squared=torch.zeros(n, t, device=device) if sum_pi_squared else None,
    )
    lengths = RowLengths.of(batch) if settings.micro_batch_tokens is not None else None
    with held_attention(model, batch, settings):
        for rows in split_rows(torch.arange(n), settings.layout, lengths):
            values, cols = rows_logprobs(
                model, batch, rows, settings, entropy=entropy, grad=False, sum_pi_squared=sum_pi_squared
            )
            out.logp[rows, cols] = (
                values.logp.float()
            )  # float32 also for a float64 model (the exactness tests')
            if entropy:
                out.entropy[rows, cols] = values.entropy.float()
            if sum_pi_squared:
                out.sum_pi_squared[rows, cols] = values.sum_pi_squared
    return out
