"""A replaced token count: losses whose denominator leaves some rows out (dapo_zv, fipo).

DAPO's token-mean divides by every valid token of the mini-batch. TRL's ``dapo_zv`` divides by the tokens of the
rows that are not zero-variance, and its ``fipo`` by the tokens of the rows it keeps. Both counts are statistics
of the whole optimizer mini-batch: computed once with `tepo.losses.mini_batch_stats` (a `TokenCount`) and handed
to every micro-batch call, they make the micro-batch losses sum to the mini-batch loss; without them a call counts
its own rows (TRL's per-micro-batch count).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tepo.losses.inputs import LossInputs


@dataclass(frozen=True)
class TokenCount:
    """The count of the tokens a loss divides by, over a mini-batch; ``loss`` names the loss it was made for."""

    count: float
    loss: str

    def rows(self, index: Any, cols: Any = None) -> TokenCount:
        """The same count for any slice of the mini-batch (a count is the mini-batch's, not the call's)."""
        del index, cols
        return self


def check_token_count(stats: Any, name: str) -> None:
    if stats is None:
        return
    if not isinstance(stats, TokenCount):
        raise ValueError(
            f"policy loss {name!r}: batch statistics must be a tepo.losses.TokenCount from mini_batch_stats, "
            f"got {type(stats).__name__}"
        )
    if stats.loss != name:
        raise ValueError(f"the TokenCount was computed for policy loss {stats.loss!r}, not {name!r}")


def rescale_to_count(
    loss_mat: torch.Tensor, inputs: LossInputs, counted: torch.Tensor, stats: TokenCount | None
) -> torch.Tensor:
    """``loss_mat`` times the factor that makes token-mean (which divides by ``T_tot = num_tokens``) divide by the
    counted tokens instead; under the other aggregations the term carries the same factor.

    With the mini-batch's `TokenCount` the factor is ``T_tot / max(count, 1)``. Without it, a call knows only its
    own rows: the factor is ``n_valid / max(n_counted, 1)`` over the call's tokens (``counted``: [N, T] bool),
    so one call on the whole batch divides by its counted tokens exactly, and equal-sized micro-batches give
    TRL's per-micro-batch count divided by the accumulation steps.
    """
    if stats is not None:
        return loss_mat * (inputs.num_tokens / max(float(stats.count), 1.0))
    dtype = loss_mat.dtype
    own = inputs.mask.sum().to(dtype) / counted.sum().to(dtype).clamp(min=1.0)
    return loss_mat * own
