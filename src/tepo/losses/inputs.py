"""The one input object every policy loss receives, and its validation.

`prepare_inputs` checks shapes, turns the mask into a bool tensor and replaces every masked entry of every
tensor by a harmless constant with ``torch.where``. Losses therefore never see the NaN/inf that padding may
hold, and since ``torch.where`` routes no gradient to the unselected branch, masked positions get exactly zero
gradient whatever they held.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tepo.losses.aggregation import as_count


@dataclass(frozen=True)
class LossInputs:
    """Tensors and global counts handed to a registered policy loss.

    All tensors are [N, T] over response tokens and already sanitised: masked entries are 0 (finite).
    ``advantages`` is already broadcast to [N, T]. ``mask`` is bool. ``num_tokens``, ``num_seqs`` and
    ``max_len`` are the global counts of the mini-batch (see `tepo.losses.aggregate`). ``is_weights`` (detached,
    or None) are the rollout-correction weights: `tepo.losses.compute_policy_loss` multiplies them into the
    loss's per-token term itself, so a registered loss must not apply them. ``rollout_logp`` (detached, or None)
    is the sampler's own log-prob of each token ("behaviour", docs/algorithms.md#the-2026-objectives); a loss
    that reads the behaviour policy takes `tepo.losses._common.behaviour_logp`, which falls back to ``old_logp``.
    """

    logp: torch.Tensor
    old_logp: torch.Tensor
    ref_logp: torch.Tensor | None
    advantages: torch.Tensor
    mask: torch.Tensor
    entropy: torch.Tensor | None
    old_entropy: torch.Tensor | None
    num_tokens: float
    num_seqs: float
    max_len: float
    is_weights: torch.Tensor | None = None
    rollout_logp: torch.Tensor | None = None


def _check_2d(name: str, tensor: torch.Tensor, shape: torch.Size) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape [N, T], got {type(tensor).__name__}")
    if tensor.shape != shape:
        raise ValueError(f"{name} must have the shape of logp {tuple(shape)}, got {tuple(tensor.shape)}")


def _compute_dtype(logp: torch.Tensor) -> torch.dtype:
    # Half-precision ratios exp(logp - old) lose too much; compute in float32 at least.
    return torch.float32 if logp.dtype in (torch.float16, torch.bfloat16) else logp.dtype


def _clean(tensor: torch.Tensor, valid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    tensor = tensor.to(dtype)
    return torch.where(valid, tensor, torch.zeros((), dtype=dtype, device=tensor.device))


def prepare_inputs(
    *,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_logp: torch.Tensor | None,
    entropy: torch.Tensor | None,
    old_entropy: torch.Tensor | None,
    num_tokens,
    num_seqs,
    max_len,
    is_weights: torch.Tensor | None = None,
    rollout_logp: torch.Tensor | None = None,
) -> LossInputs:
    """Validate the raw tensors and return sanitised `LossInputs` (see the module docstring)."""
    if not isinstance(logp, torch.Tensor) or logp.dim() != 2:
        shape = tuple(logp.shape) if isinstance(logp, torch.Tensor) else type(logp).__name__
        raise ValueError(f"logp must be a [N, T] tensor of per-token log-probabilities, got {shape}")
    if not logp.is_floating_point():
        raise ValueError(f"logp must be a floating-point tensor, got dtype {logp.dtype}")
    shape = logp.shape
    _check_2d("old_logp", old_logp, shape)
    _check_2d("mask", mask, shape)
    for name, tensor in (
        ("ref_logp", ref_logp),
        ("entropy", entropy),
        ("old_entropy", old_entropy),
        ("is_weights", is_weights),
        ("rollout_logp", rollout_logp),
    ):
        if tensor is not None:
            _check_2d(name, tensor, shape)

    if mask.dtype == torch.bool:
        valid = mask
    else:
        if not torch.all((mask == 0) | (mask == 1)):
            raise ValueError("mask must hold only 0 and 1 (or be a bool tensor)")
        valid = mask != 0
    valid = valid.to(logp.device)

    if not isinstance(advantages, torch.Tensor):
        raise ValueError(
            f"advantages must be a torch.Tensor of shape [N] or [N, T], got {type(advantages).__name__}"
        )
    if advantages.shape == shape[:1]:
        advantages = advantages.unsqueeze(-1).expand(shape)
    elif advantages.shape != shape:
        raise ValueError(
            f"advantages must have shape [N]={tuple(shape[:1])} (one per sequence) or [N, T]={tuple(shape)} "
            f"(per token), got {tuple(advantages.shape)}"
        )

    dtype = _compute_dtype(logp)
    if is_weights is not None:
        is_weights = _clean(is_weights.detach(), valid, dtype)
        if not bool(torch.all(torch.isfinite(is_weights) & (is_weights >= 0))):
            raise ValueError("is_weights must be finite and >= 0 on every valid token")
    # Only when no count is given: reading it is a GPU sync (the update always passes the mini-batch's count).
    default_tokens = max(float(valid.sum().item()), 1.0) if num_tokens is None else None
    return LossInputs(
        logp=_clean(logp, valid, dtype),
        old_logp=_clean(old_logp.detach(), valid, dtype),
        # Advantages are targets, never differentiated (a stop-gradient in every paper of the registry).
        advantages=_clean(advantages.detach(), valid, dtype),
        mask=valid,
        ref_logp=None if ref_logp is None else _clean(ref_logp.detach(), valid, dtype),
        entropy=None if entropy is None else _clean(entropy, valid, dtype),
        old_entropy=None if old_entropy is None else _clean(old_entropy.detach(), valid, dtype),
        num_tokens=as_count(num_tokens, default_tokens, "num_tokens"),
        num_seqs=as_count(num_seqs, float(max(shape[0], 1)), "num_seqs"),
        max_len=as_count(max_len, float(max(shape[1], 1)), "max_len"),
        is_weights=is_weights,
        rollout_logp=None if rollout_logp is None else _clean(rollout_logp.detach(), valid, dtype),
    )
