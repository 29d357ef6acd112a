"""What a training step is handed: :class:`StepParts`, built once by the trainer (``Trainer._setup_step_parts``).

:func:`build_step_parts` turns a config, a plan and the run's objects into one. The step
(``tepo.training.step``) and the overlapped rollout (``tepo.training.overlap``) read these parts and
nothing else of the trainer; they write none of them back (the objects inside, the model and the optimizer, are
of course changed by the update). A test or a tool can build one without a ``Trainer``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tepo.config import RunConfig, loss_options
from tepo.data import PromptStream
from tepo.training.collect import OverlongShaping, SamplerSettings
from tepo.training.logprob_pass import LogprobSettings
from tepo.training.micro_batches import resolve_micro_batch_tokens
from tepo.training.plan import StepPlan, UpdatePlan, UpdateSettings
from tepo.training.schedule import updates_per_step


@dataclass(frozen=True)
class StepParts:
    """A run's parts as a step uses them.

    ``ref_model``: the reference policy (a frozen copy, or the LoRA policy with its adapters off), None when the
    run's :class:`tepo.training.plan.StepPlan` needs none. ``rollout``: the backend (``generate``,
    ``weights_updated``; with overlapped rollouts ``stage_weights`` / ``end_staging``). ``update_plan``: how the update runs (loss, passes, an in-loop correction). ``updates_per_step``:
    planned optimizer updates per step (the LR schedule advances by it on a step with no batch). ``config``: the
    run's settings the phases read (seed, sampling, rewards, advantages, logging).
    """

    config: RunConfig
    model: torch.nn.Module
    ref_model: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any
    rollout: Any
    tokenizer: Any
    stream: PromptStream
    sampler: SamplerSettings
    overlong: OverlongShaping | None
    logprob_settings: LogprobSettings
    update_plan: UpdatePlan
    updates_per_step: int
    device: torch.device
    run_dir: Path


def build_step_parts(
    c: RunConfig,
    plan: StepPlan,
    *,
    model,
    ref_model,
    optimizer,
    scheduler,
    rollout,
    tokenizer,
    stream: PromptStream,
    device: torch.device,
    run_dir: Path,
) -> StepParts:
    """The :class:`StepParts` of a run of config ``c`` with ``plan``: the objects given, and how each phase runs
    (sampling, shaping, log-prob passes, the update) as ``c`` asks."""
    sampler = SamplerSettings(
        group_size=c.rollout.group_size,
        max_new_tokens=c.rollout.max_new_tokens,
        temperature=c.rollout.temperature,
        top_p=c.rollout.top_p,
        instruction=c.data.instruction,
        return_logprobs=True,  # the sampler's own log-probs: mismatch metrics and the correction
    )
    overlong = (
        OverlongShaping(c.rollout.max_new_tokens, c.reward.overlong_buffer, c.reward.overlong_penalty_factor)
        if c.reward.overlong_buffer
        else None
    )
    logprob_settings = LogprobSettings(
        micro_batch_size=c.train.micro_batch_size,
        temperature=c.rollout.temperature,
        autocast_bf16=c.model.autocast_bf16,
        share_prompt_prefix=c.model.share_prompt_prefix,
        train_attention=c.model.train_attention,
        micro_batch_tokens=resolve_micro_batch_tokens(c.train.micro_batch_tokens, c.rollout.max_new_tokens),
    )
    update_settings = UpdateSettings(
        loss=c.algorithm.loss,
        loss_options=loss_options(c.algorithm),
        epochs=c.train.ppo_epochs,
        mini_batch_groups=c.train.mini_batch_prompts or c.train.prompts_per_step,
        group_size=c.rollout.group_size,
        max_grad_norm=c.optim.max_grad_norm,
        max_len=float(c.rollout.max_new_tokens),
    )
    return StepParts(
        config=c,
        model=model,
        ref_model=ref_model,
        optimizer=optimizer,
        scheduler=scheduler,
        rollout=rollout,
        tokenizer=tokenizer,
        stream=stream,
        sampler=sampler,
        overlong=overlong,
        logprob_settings=logprob_settings,
        # Without an old-policy pass, a correction (one that drops nothing) is computed per micro-batch from the
        # update's own forward pass; with one, the step computes it once and hands its weights in.
        update_plan=UpdatePlan(update_settings, logprob_settings, plan.update_correction),
        updates_per_step=updates_per_step(c),
        device=device,
        run_dir=Path(run_dir),
    )
