"""Aggregation of a per-token loss matrix into one scalar (docs/algorithms.md#aggregation).

Every mode divides by *global* counts when they are passed in (`num_tokens`, `num_seqs`, `max_len`), so that
summing the losses of micro-batches gives exactly the loss (and gradient) of the whole mini-batch.
"""

from __future__ import annotations

import numbers

import torch

AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)


def check_agg_mode(mode: str) -> str:
    if mode not in AGG_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; expected one of: {', '.join(AGG_MODES)}")
    return mode


def as_count(value: float | int | torch.Tensor | None, default: float, what: str) -> float:
    """A global count given as a number or a one-element tensor; ``default`` when None; must be > 0."""
    if value is None:
        return default
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{what} must be a single number, got a tensor of shape {tuple(value.shape)}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{what} must be a number, got {type(value).__name__}")
    count = float(value)
    if not count > 0:  # also rejects NaN
        raise ValueError(f"{what} must be a positive global count, got {count}")
    return count


def aggregate(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    num_tokens: float | int | torch.Tensor | None = None,
    num_seqs: float | int | torch.Tensor | None = None,
    max_len: float | int | torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce ``loss_mat`` [N, T] over the tokens where ``mask`` is true.

    With ``m`` the mask and ``l`` the per-token loss:

    - ``token-mean``: ``sum_{i,t} m*l / T_tot``; ``T_tot = num_tokens`` (default: ``sum(m)``, at least 1).
    - ``seq-mean-token-mean``: ``(1/N_seq) sum_i (sum_t m*l / sum_t m)``; a row without tokens adds 0.
    - ``seq-mean-token-sum``: ``(1/N_seq) sum_i sum_t m*l``.
    - ``seq-mean-token-sum-norm`` (Dr. GRPO 2503.20783): ``sum_{i,t} m*l / (N_seq * L_max)``.

    ``N_seq = num_seqs`` (default: N, the rows of this call, empty rows included) and ``L_max = max_len``
    (default: T, the padded width of this call). Pass the global values when the mini-batch is split into
    micro-batches. Masked entries of ``loss_mat`` are selected away with ``torch.where`` (never multiplied by
    0), so a NaN or inf there changes neither the value nor the gradient.
    """
    check_agg_mode(mode)
    if loss_mat.dim() != 2 or loss_mat.shape != mask.shape:
        raise ValueError(
            f"aggregate: loss_mat and mask must both be [N, T] of the same shape, "
            f"got {tuple(loss_mat.shape)} and {tuple(mask.shape)}"
        )
    valid = mask.bool()
    masked = torch.where(valid, loss_mat, torch.zeros((), dtype=loss_mat.dtype, device=loss_mat.device))
    n_rows, width = loss_mat.shape

    if mode == "token-mean":
        # The call's own count only when none is given: reading it is a GPU sync, and the update always passes one.
        own = max(float(valid.sum().item()), 1.0) if num_tokens is None else None
        total = as_count(num_tokens, own, "num_tokens")
        return masked.sum() / total

    seqs = as_count(num_seqs, float(max(n_rows, 1)), "num_seqs")
    if mode == "seq-mean-token-mean":
        row_len = valid.sum(dim=-1)
        # clamp: an empty row has a zero sum, so dividing it by 1 keeps it at 0 instead of 0/0.
        row_mean = masked.sum(dim=-1) / row_len.clamp(min=1).to(masked.dtype)
        return row_mean.sum() / seqs
    if mode == "seq-mean-token-sum":
        return masked.sum() / seqs
    length = as_count(max_len, float(max(width, 1)), "max_len")
    return masked.sum() / (seqs * length)
