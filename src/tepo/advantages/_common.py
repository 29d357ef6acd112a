"""Input validation and group statistics shared by the estimators and the group filter."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

# The two standard-deviation conventions an estimator may use (see `group_std`).
STD_CONVENTIONS = ("unbiased", "population")


def validate_rewards(rewards: Any, group_size: Any) -> tuple[Tensor, int]:
    """Detached real rewards ``[N]`` (float; ints become float32) with ``N`` a multiple of ``group_size``."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if not isinstance(rewards, Tensor):
        try:
            rewards = torch.as_tensor(rewards)
        except Exception as exc:
            raise ValueError(f"rewards must be a 1-D tensor of floats, got {type(rewards).__name__}") from exc
    rewards = rewards.detach()
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    n = rewards.shape[0]
    if n == 0:
        raise ValueError("rewards is empty: need at least one group")
    if n % group_size != 0:
        raise ValueError(
            f"rewards has N={n} rows, not a multiple of group_size={group_size} "
            f"(rows of one prompt must be contiguous, N = num_groups * group_size)"
        )
    if rewards.is_complex():
        raise ValueError(f"rewards must be real, got dtype {rewards.dtype}")
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.float32)
    bad = ~torch.isfinite(rewards)
    if bad.any():
        idx = bad.nonzero().flatten().tolist()
        raise ValueError(
            f"rewards must be finite; non-finite at rows {idx[:10]}{' ...' if len(idx) > 10 else ''}"
        )
    return rewards, group_size


def grouped(rewards: Tensor, group_size: int) -> Tensor:
    """``[num_groups, G]`` view of rewards ``[N]`` (the G rows of one prompt are contiguous)."""
    return rewards.view(-1, group_size)


def zero_variance(groups: Tensor) -> Tensor:
    """[num_groups, 1] bool: all rewards of the group exactly equal.

    Such groups get exactly zero advantage by construction, so the result never depends on the float mean of
    equal values rounding back to that value (a residue divided by std + 1e-6 = 1e-6 would be amplified 1e6x).
    """
    return groups.amax(dim=1, keepdim=True) == groups.amin(dim=1, keepdim=True)


def group_std(centred: Tensor, count: Tensor | int, convention: str) -> Tensor:
    r"""Standard deviation per row from deviations already centred (and zeroed outside the row's entries).

    ``"unbiased"``: :math:`\sqrt{\sum_j c_j^2 / (n - 1)}` (Bessel's correction, ``torch.std``'s default);
    ``"population"``: :math:`\sqrt{\sum_j c_j^2 / n}`. ``count`` is ``n`` per row (``[rows, 1]``) or an int.
    Rows with too few entries for the convention (``n < 2`` unbiased, ``n < 1`` population) get 0; the
    callers give such rows zero advantage.
    """
    if convention not in STD_CONVENTIONS:
        raise ValueError(f"std convention must be 'unbiased' or 'population', got {convention!r}")
    count = torch.as_tensor(count, dtype=centred.dtype, device=centred.device)
    dof = count - 1 if convention == "unbiased" else count
    ss = centred.square().sum(dim=1, keepdim=True)
    return torch.where(dof > 0, ss / dof.clamp(min=1), 0.0).sqrt()


def check_nonnegative(estimator: str, option: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"{estimator} option {option} must be a number >= 0, got {value!r}")


def token_mask(estimator: str, mask: Any, n: int) -> Tensor:
    """``mask`` ``[N, T]`` as bool, checked (0/1 or bool values, N rows)."""
    if mask is None:
        raise ValueError(f"advantage estimator {estimator!r} is token-level and needs mask=[N, T] (got none)")
    if not isinstance(mask, Tensor):
        raise ValueError(f"{estimator}: mask must be a Tensor [N, T], got {type(mask).__name__}")
    mask = mask.detach()
    if mask.dim() != 2 or mask.shape[0] != n:
        raise ValueError(f"{estimator}: mask must have shape [N={n}, T], got {tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        if not ((mask == 0) | (mask == 1)).all():
            raise ValueError(f"{estimator}: mask must hold only 0/1 (or bool) values")
        mask = mask != 0
    return mask


def token_input(estimator: str, label: str, value: Any, mask: Tensor) -> Tensor:
    """Detached float64 copy of a per-token input, zeroed where ``mask`` is 0.

    Padding is allowed to hold anything (NaN, inf); a non-finite value at a valid position is an error.
    """
    if value is None:
        raise ValueError(
            f"advantage estimator {estimator!r} needs {label}=[N, T] (same shape as mask) but it was not given"
        )
    if not isinstance(value, Tensor):
        raise ValueError(f"{estimator}: {label} must be a Tensor [N, T], got {type(value).__name__}")
    value = value.detach()
    if value.shape != mask.shape:
        raise ValueError(
            f"{estimator}: {label} has shape {tuple(value.shape)}, expected the mask's shape {tuple(mask.shape)}"
        )
    value = value.to(torch.float64)
    bad = mask & ~torch.isfinite(value)
    if bad.any():
        first = tuple(bad.nonzero()[0].tolist())
        raise ValueError(
            f"{estimator}: {label} has {int(bad.sum())} non-finite value(s) at valid (mask=1) positions, "
            f"first at (row, token) = {first}"
        )
    return torch.where(mask, value, 0.0)
