"""What the token-level estimators (``tepo.advantages.token_level``, ``tepo.advantages.ep_grpo``) share: the
sequence-level base estimator they reshape, the z-score over pools of entries, and the positional buckets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from tepo.advantages._common import group_std
from tepo.advantages.compute import compute_advantages
from tepo.advantages.registry import ADVANTAGE_ESTIMATORS, estimator_requires, get_advantage_estimator


def base_requires(estimator: str, base: Any, base_options: Any) -> frozenset[str]:
    """What the sequence-level ``base`` reads; ValueError when it is unknown or token-level."""
    if get_advantage_estimator(base).token_level:
        seq_names = [n for n, e in ADVANTAGE_ESTIMATORS.items() if not e.token_level]
        raise ValueError(
            f"{estimator}: base estimator must be sequence-level, {base!r} is token-level; "
            f"valid bases: {', '.join(seq_names)}"
        )
    if base_options is not None and not isinstance(base_options, Mapping):
        raise ValueError(
            f"{estimator} option base_options must be a mapping, got {type(base_options).__name__}"
        )
    return estimator_requires(base, base_options)


def base_advantages(
    estimator: str, base: str, base_options: Mapping | None, rewards: Tensor, group_size: int, **inputs: Any
) -> Tensor:
    base_requires(estimator, base, base_options)
    return compute_advantages(base, rewards, group_size, **inputs, **(base_options or {})).to(torch.float64)


def masked_zscore(values: Tensor, mask: Tensor, eps: float) -> Tensor:
    """Z-score of ``values[k, :]`` over its masked entries, row by row (rows = pools of entries).

    Population std (divide by the count; see ``erpo_advantages`` for why); rows with fewer than two entries,
    or with zero spread, give 0. Unmasked entries come out 0.
    """
    count = mask.sum(dim=1, keepdim=True).to(values.dtype)
    v = torch.where(mask, values, 0.0)
    mean = v.sum(dim=1, keepdim=True) / count.clamp(min=1)
    centred = torch.where(mask, v - mean, 0.0)
    sd = group_std(centred, count, "population")
    z = centred / (sd + eps)
    return torch.where(mask & (count >= 2) & (sd > 0), z, 0.0)


def positional_buckets(m: Tensor, num_buckets: int) -> Tensor:
    """``(K p) // L_i`` in integers for every position: ``p`` the 0-based index of the token among the ``L_i``
    valid tokens of its response (``m`` the ``[N, T]`` bool mask), K = ``num_buckets``. Not clamped and not
    masked: at padding the value means nothing, and each caller clamps and masks as its estimator says."""
    length = m.sum(dim=1, keepdim=True)
    position = torch.cumsum(m.long(), dim=1) - 1  # 0-based index among valid tokens
    return torch.div(num_buckets * position, length.clamp(min=1), rounding_mode="floor")
