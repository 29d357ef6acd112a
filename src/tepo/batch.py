"""Assembling rollout batches for the update: merging rounds, selecting groups, slicing micro-batches.

Dynamic sampling can draw several rounds of prompts whose batches have different prompt widths ``P`` and
response widths ``T``; ``concat_rollouts`` re-pads them into one batch laid out as ``RolloutBatch`` requires
(prompt left-padded, response right-padded). ``trim`` cuts a slice of rows to the columns they actually use, so
a micro-batch of short responses does not pay for the longest one in the step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from tepo.rollout.base import RolloutBatch


def concat_rollouts(batches: Sequence[RolloutBatch], pad_token_id: int) -> RolloutBatch:
    if len(batches) == 1:
        return batches[0]
    width_p = max(b.prompt_len for b in batches)
    width_t = max(b.response_len for b in batches)
    ids, att, rmask, index, logp = [], [], [], [], []
    offset = 0
    for b in batches:
        n, p, t, device = b.input_ids.shape[0], b.prompt_len, b.response_len, b.input_ids.device
        left = torch.full((n, width_p - p), pad_token_id, dtype=b.input_ids.dtype, device=device)
        right = torch.full((n, width_t - t), pad_token_id, dtype=b.input_ids.dtype, device=device)
        ids.append(torch.cat([left, b.input_ids[:, :p], b.input_ids[:, p:], right], 1))
        zeros_l = torch.zeros((n, width_p - p), dtype=b.attention_mask.dtype, device=device)
        zeros_r = torch.zeros((n, width_t - t), dtype=b.attention_mask.dtype, device=device)
        att.append(torch.cat([zeros_l, b.attention_mask, zeros_r], 1))
        rmask.append(torch.cat([b.response_mask, torch.zeros((n, width_t - t), device=device)], 1))
        index.append(b.prompt_index + offset)
        offset += int(b.prompt_index.max()) + 1 if n else 0
        if b.rollout_logp is not None:
            logp.append(torch.cat([b.rollout_logp, torch.zeros((n, width_t - t), device=device)], 1))
    return RolloutBatch(
        input_ids=torch.cat(ids),
        attention_mask=torch.cat(att),
        response_mask=torch.cat(rmask),
        response_len=width_t,
        prompt_index=torch.cat(index),
        texts=[t for b in batches for t in b.texts],
        truncated=torch.cat([b.truncated for b in batches]),
        gen_seconds=sum(b.gen_seconds for b in batches),
        num_generated_tokens=sum(b.num_generated_tokens for b in batches),
        rollout_logp=torch.cat(logp) if len(logp) == len(batches) else None,
    )


def select_rollout_rows(batch: RolloutBatch, rows: Tensor) -> RolloutBatch:
    """The rows ``rows`` (long indices) of a batch, trimmed to the columns they use."""
    picked = RolloutBatch(
        input_ids=batch.input_ids[rows],
        attention_mask=batch.attention_mask[rows],
        response_mask=batch.response_mask[rows],
        response_len=batch.response_len,
        prompt_index=batch.prompt_index[rows],
        texts=[batch.texts[i] for i in rows.tolist()],
        truncated=batch.truncated[rows],
        gen_seconds=batch.gen_seconds,
        num_generated_tokens=int(batch.response_mask[rows].sum()),
        rollout_logp=None if batch.rollout_logp is None else batch.rollout_logp[rows],
    )
    return picked


def trim_columns(
    input_ids: Tensor, attention_mask: Tensor, response_len: int
) -> tuple[Tensor, Tensor, int, slice]:
    """Drop prompt columns that are padding in every row and response columns after every row's end.

    Returns the trimmed ids/mask, the new response length, and the slice of the original response columns kept
    (to cut ``[N, T]`` tensors such as advantages and masks the same way).
    """
    prompt_len = input_ids.shape[1] - response_len
    # Both bounds in one host read (two nonzero() calls and their lengths were four GPU syncs per micro-batch):
    # the first used prompt column (prompt_len - 1 when none is used) and the last used response column + 1
    # (1 when none is used).
    used_prompt = attention_mask[:, :prompt_len].any(0)
    used_resp = attention_mask[:, prompt_len:].any(0)
    first_used = used_prompt.int().argmax() if prompt_len else used_prompt.new_zeros((), dtype=torch.long)
    last_used = (
        response_len - 1 - used_resp.flip(0).int().argmax()
        if response_len
        else used_resp.new_zeros((), dtype=torch.long)
    )
    first, new_t, any_prompt, any_resp = torch.stack(
        [first_used.long(), last_used.long() + 1, used_prompt.any().long(), used_resp.any().long()]
    ).tolist()
    first = first if any_prompt else prompt_len - 1
    new_t = new_t if any_resp else 1
    cols = slice(first, prompt_len + new_t)
    return input_ids[:, cols], attention_mask[:, cols], new_t, slice(0, new_t)
