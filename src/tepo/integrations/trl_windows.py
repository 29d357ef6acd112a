"""The exact token and sequence counts of each optimizer window of `TepoGRPOTrainer` (the module docstring of
`tepo.integrations.trl` says why): counted over all processes right after generation and written into each
micro-batch's inputs, or TRL's own expected count where the windows straddle generations."""

from __future__ import annotations

from typing import Any

import torch

# Keys this adapter adds to TRL's per-micro-batch input dicts.
NUM_TOKENS = "tepo_num_tokens"
NUM_SEQS = "tepo_num_seqs"
KEEP = "tepo_keep"


def loss_mask(inputs: dict[str, Any]) -> torch.Tensor:
    """The tokens the loss counts: the completion's, less tool output and the groups dynamic sampling dropped."""
    mask = inputs["completion_mask"].bool()
    if inputs.get("tool_mask") is not None:
        mask = mask & inputs["tool_mask"].bool()
    if inputs.get(KEEP) is not None:
        mask = mask & inputs[KEEP].bool().unsqueeze(-1)
    return mask


def num_rows(inputs: dict[str, Any]) -> int:
    """Sequences of the batch as `compute_policy_loss` counts them: every row, except filtered groups'."""
    keep = inputs.get(KEEP)
    return int(keep.sum().item()) if keep is not None else int(inputs["completion_mask"].shape[0])


def annotate_counts(accelerator, slices: list[dict[str, Any]], window_size: int) -> None:
    """Write into each slice the global token and sequence counts of its optimizer window, divided by P.

    Windows are groups of ``window_size`` consecutive slices. Counts are summed over all processes (one
    collective call), then divided by P because the gradients are averaged over processes.
    """
    local = torch.tensor(
        [[float(loss_mask(s).sum().item()), float(num_rows(s))] for s in slices],
        device=accelerator.device,
    )
    totals = accelerator.reduce(local, reduction="sum").cpu()  # [num_slices, 2]
    processes = float(accelerator.num_processes)
    for start in range(0, len(slices), window_size):
        tokens, seqs = totals[start : start + window_size].sum(dim=0).tolist()
        for s in slices[start : start + window_size]:
            # max(., 1): a window whose groups were all filtered has no tokens; its loss is then 0.
            s[NUM_TOKENS] = max(tokens, 1.0) / processes
            s[NUM_SEQS] = max(seqs, 1.0) / processes


def window_counts(trainer, inputs: dict[str, Any]) -> tuple[float, float]:
    """``(num_tokens, num_seqs)`` of ``inputs``' window: the exact ones written by :func:`annotate_counts`, else
    TRL's own rule (its ``dapo`` normaliser, the expected count)."""
    if NUM_TOKENS in inputs:
        return inputs[NUM_TOKENS], inputs[NUM_SEQS]
    processes = trainer.accelerator.num_processes
    tokens = float(inputs["num_items_in_batch"].clamp(min=1.0).item()) / processes
    seqs = float(num_rows(inputs))
    if trainer.model.training:
        # Trainer sets current_gradient_accumulation_steps per window (fewer at an epoch's end).
        accumulation = getattr(
            trainer, "current_gradient_accumulation_steps", trainer.args.gradient_accumulation_steps
        )
        tokens *= accumulation / trainer.args.steps_per_generation
        seqs *= accumulation
    return tokens, seqs
