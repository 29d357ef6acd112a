"""Which rows of a mini-batch go through the model together: fixed-row or token-budget micro-batches.

A micro-batch is run trimmed to its own columns (`tepo.batch.trim_columns`): as wide as its longest real prompt
plus its longest response. Its compute and activation memory therefore grow with its *padded area*,
``rows x (longest prompt + longest response)``, not with its real tokens. Fixed-row micro-batches
(``train.micro_batch_size`` rows in rollout order) pay for every short row next to a long one; at 1024-token
responses that is about half of the computed tokens (docs/results/scaling).

Token-budget micro-batches (``train.micro_batch_tokens``) use the rule named here **sorted next-fit**: rows sorted
by real response length, then prompt length, longest first, ties kept in rollout order; a micro-batch takes the next
row while its padded area stays within the budget, else a new one starts (a row longer than the budget goes
alone). Sorting puts rows of like length together, so each micro-batch's padding is small, and the budget bounds
its memory whatever the response lengths. verl's ``use_dynamic_bsz`` balances a token budget across data-parallel
ranks (Karmarkar-Karp); with one process there is nothing to balance, and sorting is what removes the padding.

The gradient does not depend on the layout: every loss is normalised by its mini-batch's counts (`tepo.losses`),
and mini-batch statistics are sliced with ``stats.rows(index, cols)`` for any index, so a permuted, uneven split
sums to the same gradient (tests/training/test_micro_batch_tokens.py, float64, every registered loss).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tepo.rollout.base import RolloutBatch

# What ``train.micro_batch_tokens: auto`` resolves to (docs/performance.md "Token-budget micro-batches", measured
# with benchmarks/bench_micro_batches.py on the embedded model): fixed rows below AUTO_FROM_NEW_TOKENS, where they
# keep model.share_prompt_prefix's one prompt per group and micro-batch (the sorted budget was no faster at 64 new
# tokens, and at 256 1.15x faster with 13% more peak memory), and a sorted AUTO_BUDGET_TOKENS budget from there on
# (1.27x faster at 512 and 2.5x at 1024, each with less peak memory), where padding is most of a fixed micro-batch.
AUTO_FROM_NEW_TOKENS = 512
AUTO_BUDGET_TOKENS = 4096


def resolve_micro_batch_tokens(value: Any, max_new_tokens: int) -> int | None:
    """``train.micro_batch_tokens`` as a run uses it: an int or None as given; ``"auto"``: a budget of
    ``AUTO_BUDGET_TOKENS`` when responses may reach ``AUTO_FROM_NEW_TOKENS`` tokens (``rollout.max_new_tokens``),
    else None (``train.micro_batch_size`` rows in rollout order)."""
    if value == "auto":
        return AUTO_BUDGET_TOKENS if max_new_tokens >= AUTO_FROM_NEW_TOKENS else None
    return value


@dataclass(frozen=True)
class MicroBatchLayout:
    """``rows`` per micro-batch, or with ``tokens`` a padded-area budget per micro-batch (then ``rows`` is unused)."""

    rows: int
    tokens: int | None = None

    def __post_init__(self):
        if self.rows < 1:
            raise ValueError(f"micro-batch rows must be >= 1; got {self.rows}")
        if self.tokens is not None and self.tokens < 1:
            raise ValueError(f"micro-batch token budget must be >= 1 or None; got {self.tokens}")


@dataclass(frozen=True)
class RowLengths:
    """Real prompt and response tokens of every row of a batch, read to the host once per step (a host tensor
    for indexing without further reads, and python lists for the planner)."""

    prompt: Tensor
    response: Tensor

    @classmethod
    def of(cls, batch: RolloutBatch) -> RowLengths:
        att = batch.attention_mask
        prompt_width = att.shape[1] - batch.response_len
        both = torch.stack([att[:, :prompt_width].sum(1), att[:, prompt_width:].sum(1)]).cpu()
        return cls(both[0], both[1])

    def padded_tokens(self, micro_batches: list[Tensor]) -> tuple[int, int]:
        """``(computed, real)`` tokens of running ``micro_batches`` each trimmed to its own columns
        (`tepo.batch.trim_columns`): computed is the sum of their padded areas, real their prompt + response
        tokens. Two host reads, whatever the number of micro-batches."""
        micro_batches = [m.cpu() for m in micro_batches if len(m)]
        if not micro_batches:
            return 0, 0
        areas = torch.stack([len(m) * (self.prompt[m].max() + self.response[m].max()) for m in micro_batches])
        rows = torch.cat(micro_batches)
        return int(areas.sum()), int((self.prompt[rows] + self.response[rows]).sum())


def split_rows(rows: Tensor, layout: MicroBatchLayout, lengths: RowLengths | None = None) -> list[Tensor]:
    """``rows`` (indices into the batch ``lengths`` describes) as micro-batches under ``layout``; together they
    hold each row once. ``lengths`` is needed for a token budget only."""
    if layout.tokens is None:
        return list(rows.split(layout.rows))
    if lengths is None:
        raise ValueError("a token-budget layout needs the rows' lengths (RowLengths.of(batch))")
    ids = rows.tolist()
    prompt, response = lengths.prompt.tolist(), lengths.response.tolist()
    # Longest response first, then longest prompt; the sort is stable, so ties keep rollout order (and a group's
    # rows together). By response rather than by prompt + response: a micro-batch is as wide as its longest
    # prompt plus its longest response, and mixing a long prompt with a short response (same total) pads both
    # (with GSM8K-like lengths 13% of the computed tokens are padding at 256 new tokens instead of 18%).
    ids.sort(key=lambda i: (-response[i], -prompt[i]))
    groups: list[list[int]] = []
    widest_prompt = longest_response = 0
    for i in ids:
        p, r = max(widest_prompt, prompt[i]), max(longest_response, response[i])
        if groups and (len(groups[-1]) + 1) * (p + r) <= layout.tokens:
            groups[-1].append(i)
            widest_prompt, longest_response = p, r
        else:
            groups.append([i])
            widest_prompt, longest_response = prompt[i], response[i]
    return [torch.tensor(g, dtype=torch.long, device=rows.device) for g in groups]
