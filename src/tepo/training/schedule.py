"""Learning-rate schedule and update counts of a run."""

from __future__ import annotations

import math
import warnings

from tepo.config import RunConfig


def updates_per_step(config: RunConfig) -> int:
    """Planned optimizer updates per training step: ``ppo_epochs`` x mini-batches per epoch."""
    mini = config.train.mini_batch_prompts or config.train.prompts_per_step
    return config.train.ppo_epochs * math.ceil(config.train.prompts_per_step / mini)


def lr_factor(config: RunConfig, total_updates: int):
    """The LR multiplier of planned update ``u`` (0-based): linear warm-up, then constant, cosine or linear decay.

    The schedule counts *planned* updates, applied or skipped (a non-finite mini-batch, a step that dynamic
    sampling emptied), so the learning rate at training step k is a function of k alone, as with verl's and the
    transformers Trainer's schedulers, and a resumed run continues on the same curve.
    """
    warmup, schedule = config.optim.warmup_steps, config.optim.schedule

    def factor(update: int) -> float:
        if warmup and update < warmup:
            return (update + 1) / warmup
        progress = (update - warmup) / max(1, total_updates - warmup)
        if schedule == "cosine":
            return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
        if schedule == "linear":
            return max(0.0, 1 - progress)
        return 1.0

    return factor


def advance_schedule(scheduler, updates: int = 1) -> None:
    """Step the LR schedule for ``updates`` planned updates, whether or not the optimizer stepped.

    torch warns when a scheduler steps before the optimizer's first step; here that is the intended reading of
    a skipped update (see :func:`lr_factor`), so the warning is silenced for this call only.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)`")
        for _ in range(updates):
            scheduler.step()
