"""Dynamic sampling (DAPO): which groups of a rollout batch carry a learning signal, and row selection."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tepo.advantages._common import grouped, validate_rewards, zero_variance


@dataclass(frozen=True)
class GroupFilterResult:
    """Which groups survive dynamic sampling.

    ``keep_mask``: ``[N]`` bool, whole groups. ``kept_group_indices``: ``[num_kept]`` long.
    ``metrics``: ``groups_total``, ``groups_kept``, ``groups_dropped_all_correct``, ``groups_dropped_all_wrong``,
    ``groups_dropped_all_equal`` (all dropped groups, including the two kinds before), ``frac_groups_dropped``.
    """

    keep_mask: Tensor
    kept_group_indices: Tensor
    group_size: int
    metrics: dict[str, float]

    def select(self, rows: Any) -> Any:
        """Kept rows of ``rows`` (a tensor ``[N, ...]`` or a sequence of length ``N``), same type back."""
        return select_rows(self.keep_mask, rows)


def select_rows(keep_mask: Tensor, rows: Any) -> Any:
    """Rows of ``rows`` where ``keep_mask`` ``[N]`` is True: a tensor ``[N, ...]`` or a list/tuple of length N."""
    keep_mask = torch.as_tensor(keep_mask, dtype=torch.bool)
    if keep_mask.dim() != 1:
        raise ValueError(f"keep_mask must be 1-D [N], got shape {tuple(keep_mask.shape)}")
    n = keep_mask.shape[0]
    if isinstance(rows, Tensor):
        if rows.dim() == 0 or rows.shape[0] != n:
            raise ValueError(
                f"cannot select rows: tensor has shape {tuple(rows.shape)}, expected first dim N={n}"
            )
        return rows[keep_mask.to(rows.device)]
    if isinstance(rows, (list, tuple)):
        if len(rows) != n:
            raise ValueError(f"cannot select rows: sequence has length {len(rows)}, expected N={n}")
        kept = [r for r, k in zip(rows, keep_mask.tolist()) if k]
        return type(rows)(kept) if isinstance(rows, tuple) else kept
    raise ValueError(f"cannot select rows of a {type(rows).__name__}; pass a Tensor [N, ...] or a list/tuple")


def filter_groups(
    rewards: Tensor, group_size: int, *, correct: Tensor | Sequence[bool] | None = None
) -> GroupFilterResult:
    r"""Dynamic sampling filter (DAPO 2503.14476 Sec. 3.2; TEPO 2510.09369 Eq. 10, ``0 < |correct| < G``).

    A group is dropped when all its G rewards are exactly equal: its group-relative advantage is zero for
    ``grpo``/``dr_grpo``/``rloo`` and it would only dilute the batch. With binary rewards this is exactly
    TEPO's constraint. Dropped groups are classified for the metrics by ``correct`` (``[N]`` bool, from the
    verifier); when ``correct`` is not given it is read as ``rewards > 0`` (binary 0/1 rewards). A dropped
    group that is neither all correct nor all wrong (equal shaped rewards, mixed correctness) counts only
    in ``groups_dropped_all_equal``. With G = 1 every group is dropped.
    """
    rewards, group_size = validate_rewards(rewards, group_size)
    n = rewards.shape[0]
    num_groups = n // group_size
    if correct is None:
        correct_t = rewards > 0
    else:
        correct_t = torch.as_tensor(correct).detach().to(rewards.device)
        if correct_t.shape != (n,):
            raise ValueError(f"correct must have shape [N={n}], got {tuple(correct_t.shape)}")
        correct_t = correct_t.to(torch.bool)
    groups = grouped(rewards, group_size)
    dropped = zero_variance(groups).squeeze(1)
    corr = correct_t.view(num_groups, group_size)
    all_correct = dropped & corr.all(dim=1)
    all_wrong = dropped & ~corr.any(dim=1)
    keep_groups = ~dropped
    n_dropped = int(dropped.sum())
    metrics = {
        "groups_total": num_groups,
        "groups_kept": num_groups - n_dropped,
        "groups_dropped_all_correct": int(all_correct.sum()),
        "groups_dropped_all_wrong": int(all_wrong.sum()),
        "groups_dropped_all_equal": n_dropped,
        "frac_groups_dropped": n_dropped / num_groups,
    }
    return GroupFilterResult(
        keep_mask=keep_groups.repeat_interleave(group_size),
        kept_group_indices=keep_groups.nonzero().flatten(),
        group_size=group_size,
        metrics=metrics,
    )


def all_equal_group_stats(rewards: Tensor, advantages: Tensor, mask: Tensor, group_size: int) -> dict:
    """What a step's estimator did with the groups whose rewards are all equal (GRPO gives them no gradient;
    EP-GRPO's polarity fallback may).

    ``frac_groups_all_equal``: the share of the batch's groups whose G rewards are exactly equal.
    ``frac_all_equal_tokens_advantaged``: among those groups' valid tokens (``mask``), the share whose advantage
    is nonzero; None when the batch has no such group. ``advantages`` ``[N]`` (a row's value on all its tokens)
    or ``[N, T]``.
    """
    all_equal = zero_variance(grouped(rewards.detach(), group_size)).reshape(-1)
    rows = all_equal.repeat_interleave(group_size)
    adv = advantages.detach()
    nonzero = (adv != 0).unsqueeze(1).expand_as(mask) if adv.dim() == 1 else adv != 0
    tokens = mask.bool() & rows.unsqueeze(1)
    count = int(tokens.sum())
    return {
        "frac_groups_all_equal": float(all_equal.float().mean()),
        "frac_all_equal_tokens_advantaged": float((nonzero & tokens).sum()) / count if count else None,
    }
