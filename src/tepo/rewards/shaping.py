"""DAPO's overlong reward shaping: the soft overlong punishment and overlong filtering, as pure tensor functions.

DAPO (Yu et al., arXiv 2503.14476, Sec. 3.4 "Overlong Reward Shaping"):

- **Soft overlong punishment** (Eq. 13), with ``L_max`` the maximum response length and ``L_cache`` the buffer::

      R_length(y) = 0                                   if |y| <= L_max - L_cache
                  = ((L_max - L_cache) - |y|) / L_cache   if L_max - L_cache < |y| <= L_max
                  = -1                                  if |y| > L_max

  added to the rule-based correctness reward. It falls linearly from 0 at ``L_max - L_cache`` tokens to -1 at
  ``L_max`` tokens.
- **Overlong filtering**: "masks the loss of truncated samples" (responses cut by the length limit).

Readings where the paper is silent, following verl's DAPO reward manager (``verl/workers/reward_manager/dapo.py``,
config ``overlong_buffer: {enable, len, penalty_factor, log}``; its DAPO recipe uses ``len = 4096`` with a
maximum response length of 20480 and ``penalty_factor = 1.0``):

- The penalty is scaled by ``penalty_factor`` (verl: ``min(-(|y| - (L_max - L_cache)) / L_cache * factor, 0)``);
  the paper's equation is ``penalty_factor = 1``.
- ``|y|`` counts generated tokens, the end-of-sequence token included (verl: the response's attention-mask sum;
  here ``RolloutBatch.response_lengths``).
- Beyond ``L_max`` the paper's -1 holds (verl has no lower clamp, but its responses never exceed ``L_max``;
  neither do ours, so the two agree on every reachable length).
- The penalty is added to the correctness reward before advantages; verl's DAPO recipe filters groups for dynamic
  sampling on accuracy (``filter_groups.metric=acc``), not on the shaped reward.
- verl's DAPO recipe turns the soft punishment on and implements no overlong filtering; the filter here is the
  paper's: a truncated sample keeps its reward and its place in its group's statistics (advantages, dynamic
  sampling) and only its tokens leave the loss (and a token-mean loss's token count).

With a 0/1 correctness reward (this project's; DAPO's is -1/+1) a correct response at ``L_max`` tokens scores
``1 - penalty_factor``.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import torch
from torch import Tensor


def _check_lengths(max_len: int, buffer_len: int, penalty_factor: float) -> None:
    if isinstance(max_len, bool) or not isinstance(max_len, Integral) or max_len < 1:
        raise ValueError(f"overlong_penalty: max_len must be an int >= 1, got {max_len!r}")
    if isinstance(buffer_len, bool) or not isinstance(buffer_len, Integral) or not 0 <= buffer_len <= max_len:
        raise ValueError(
            f"overlong_penalty: buffer_len must be an int in [0, max_len={max_len}], got {buffer_len!r}"
        )
    if not (
        isinstance(penalty_factor, Real)
        and not isinstance(penalty_factor, bool)
        and math.isfinite(penalty_factor)
        and penalty_factor >= 0
    ):
        raise ValueError(
            f"overlong_penalty: penalty_factor must be a finite number >= 0, got {penalty_factor!r}"
        )


def overlong_buffer_tokens(buffer: float, max_new_tokens: int) -> int:
    """``reward.overlong_buffer`` in tokens: a value >= 1 is a number of tokens; a value in (0, 1) a share of the
    response limit, rounded to the nearest token and at least 1 (DAPO's recipe is 4096 of 20480, a share of 0.2,
    which the ``dapo`` preset sets so that its buffer follows any ``rollout.max_new_tokens``); 0 is off."""
    if 0 < buffer < 1:
        return max(1, round(buffer * max_new_tokens))
    return int(buffer)


def overlong_penalty(
    response_lengths: Tensor, *, max_len: int, buffer_len: int, penalty_factor: float = 1.0
) -> Tensor:
    """DAPO's soft overlong punishment (arXiv 2503.14476, Eq. 13), scaled by ``penalty_factor`` as in verl::

        penalty(|y|) = penalty_factor * clamp(((max_len - buffer_len) - |y|) / buffer_len, -1, 0)

    i.e. 0 up to ``max_len - buffer_len`` tokens, then linear down to ``-penalty_factor`` at ``max_len`` tokens,
    and ``-penalty_factor`` beyond. ``buffer_len = 0`` turns it off (all zeros).

    Args:
        response_lengths: ``[N]`` (any shape) generated tokens per response, EOS included; integer or float,
            >= 0.
        max_len: ``L_max``, the generation limit (``rollout.max_new_tokens``).
        buffer_len: ``L_cache`` (``reward.overlong_buffer``), in ``[0, max_len]``.
        penalty_factor: scale of the penalty (``reward.overlong_penalty_factor``), >= 0.

    Returns:
        float32 tensor (``response_lengths``'s dtype if it is floating) of the same shape, values in
        ``[-penalty_factor, 0]``; add it to the correctness rewards. No gradient flows (lengths are counts).
    """
    _check_lengths(max_len, buffer_len, penalty_factor)
    if not isinstance(response_lengths, Tensor):
        raise TypeError(
            f"overlong_penalty: response_lengths must be a tensor, got {type(response_lengths).__name__}"
        )
    if response_lengths.dtype == torch.bool or response_lengths.is_complex():
        raise TypeError(
            f"overlong_penalty: response_lengths must hold counts, got dtype {response_lengths.dtype}"
        )
    dtype = response_lengths.dtype if response_lengths.is_floating_point() else torch.float32
    lengths = response_lengths.detach()
    if lengths.numel() and bool((lengths < 0).any()):
        raise ValueError("overlong_penalty: response_lengths must be >= 0")
    if buffer_len == 0 or penalty_factor == 0:
        return torch.zeros(lengths.shape, dtype=dtype, device=lengths.device)
    # float64: the excess of an integer length is exact, and one division rounds once.
    excess = lengths.to(torch.float64) - (max_len - buffer_len)
    fraction = (excess / buffer_len).clamp(min=0.0, max=1.0)
    return (-penalty_factor * fraction).to(dtype)


def overlong_filter_mask(truncated: Tensor) -> Tensor:
    """DAPO's overlong filtering (arXiv 2503.14476, Sec. 3.4): which responses stay in the loss.

    Returns ``~truncated`` as a bool ``[N]``: True for a response that ended with an end-of-sequence token,
    False for one cut by the generation limit (``RolloutBatch.truncated``). Multiply it into the token mask with
    :func:`mask_truncated`.
    """
    if not isinstance(truncated, Tensor) or truncated.dtype != torch.bool:
        got = truncated.dtype if isinstance(truncated, Tensor) else type(truncated).__name__
        raise TypeError(f"overlong_filter_mask: truncated must be a bool tensor [N], got {got}")
    return ~truncated


def mask_truncated(response_mask: Tensor, truncated: Tensor) -> Tensor:
    """``response_mask`` ``[N, T]`` with the rows of truncated responses zeroed (overlong filtering).

    The result replaces the loss mask only (``tepo.losses.aggregation.aggregate``'s ``mask``): "token-mean" also
    drops the filtered tokens from its token count, while the sequence-level modes still count a filtered row in
    ``N_seq`` (an empty row contributes 0). Rewards, advantages and group statistics are computed before and do
    not change. Same dtype and device as ``response_mask``.
    """
    keep = overlong_filter_mask(truncated)
    if response_mask.dim() != 2 or keep.shape != response_mask.shape[:1]:
        raise ValueError(
            f"mask_truncated: response_mask {tuple(response_mask.shape)} and truncated {tuple(truncated.shape)} "
            "must be [N, T] and [N]"
        )
    return response_mask * keep.to(device=response_mask.device, dtype=response_mask.dtype).unsqueeze(1)
