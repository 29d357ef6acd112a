"""What a training step is handed: :class:`StepParts`, built once by the trainer (``Trainer._setup_step_parts``).

:func:`build_step_parts` turns a config and the run's objects into one. It is the single owner of the
run's objects (the trainer keeps no second reference: ``Trainer.model`` reads ``parts.model``), and it holds the
settings a step reads already resolved (:class:`StepSettings`: the reward functions and their weights parsed
once, not at every step). The step (``tepo.training.step``) and the overlapped rollout
(``tepo.training.overlap``) read these parts and nothing else of the trainer; they write none of them back (the
objects inside, the model and the optimizer, are of course changed by the update). A test or a tool can build
one without a ``Trainer``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from tepo.config import RunConfig
from tepo.data import PromptStream
from tepo.rewards.functions import parse_reward_functions
from tepo.rollout.base import RolloutBackend
from tepo.training.collect import OverlongShaping, SamplerSettings
from tepo.training.schedule import updates_per_step

if TYPE_CHECKING:  # transformers loads in seconds: not at import of the package
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class StepSettings:
    """The run's settings a step reads, resolved from the config once.

    ``reward_functions``: ``(name, weight)`` of ``reward.functions``, parsed once (``tepo.rewards.functions``);
    ``advantage`` / ``advantage_options``: the estimator; ``overlong_filter``: truncated responses leave the loss
    mask; ``samples_every`` / ``samples_rows``: the token view's records (``log.*``).
    """

    seed: int
    prompts_per_step: int
    group_size: int
    ppo_epochs: int
    dynamic_sampling: bool
    max_resample_rounds: int
    reward_functions: tuple[tuple[str, float], ...]
    advantage: str
    advantage_options: dict
    overlong_filter: bool
    samples_every: int
    samples_rows: int | None

    @property
    def reward_weights(self) -> list[float]:
        return [weight for _, weight in self.reward_functions]

    @staticmethod
    def of(c: RunConfig) -> StepSettings:
        return StepSettings(
            seed=c.train.seed,
            prompts_per_step=c.train.prompts_per_step,
            group_size=c.rollout.group_size,
            ppo_epochs=c.train.ppo_epochs,
            dynamic_sampling=c.algorithm.dynamic_sampling,
            max_resample_rounds=c.algorithm.max_resample_rounds,
            reward_functions=tuple(parse_reward_functions(c.reward.functions)[0]),
            advantage=c.algorithm.advantage,
            advantage_options=dict(c.algorithm.advantage_options),
            overlong_filter=c.reward.overlong_filter,
            samples_every=c.log.samples_every,
            samples_rows=c.log.samples_rows,
        )


@dataclass(frozen=True)
class StepParts:
    """A run's parts as a step uses them.

    ``ref_model``: the reference policy (a frozen copy, or the LoRA policy with its adapters off), None when the
    run's :class:`tepo.training.plan.StepPlan` needs none. ``rollout``: the backend (its ``parity_guard`` handed
    to it when it was built). How the passes and the update run is the plan's, not the parts'.
    ``updates_per_step``: planned optimizer updates per step (the LR schedule advances
    by it on a step with no batch). ``settings``: what the phases read of the config (:class:`StepSettings`).
    """

    settings: StepSettings
    model: torch.nn.Module
    ref_model: torch.nn.Module | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    rollout: RolloutBackend
    tokenizer: PreTrainedTokenizerBase
    stream: PromptStream
    sampler: SamplerSettings
    overlong: OverlongShaping | None
    updates_per_step: int
    device: torch.device
    run_dir: Path


def build_step_parts(
    c: RunConfig,
    *,
    model: torch.nn.Module,
    ref_model: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    rollout: RolloutBackend,
    tokenizer: PreTrainedTokenizerBase,
    stream: PromptStream,
    device: torch.device,
    run_dir: Path,
) -> StepParts:
    """The :class:`StepParts` of a run of config ``c``: the objects given, and how sampling and reward shaping
    run as ``c`` asks."""
    return StepParts(
        settings=StepSettings.of(c),
        model=model,
        ref_model=ref_model,
        optimizer=optimizer,
        scheduler=scheduler,
        rollout=rollout,
        tokenizer=tokenizer,
        stream=stream,
        sampler=_sampler_settings(c),
        overlong=_overlong_shaping(c),
        updates_per_step=updates_per_step(c),
        device=device,
        run_dir=Path(run_dir),
    )


def _sampler_settings(c: RunConfig) -> SamplerSettings:
    return SamplerSettings(
        group_size=c.rollout.group_size,
        max_new_tokens=c.rollout.max_new_tokens,
        temperature=c.rollout.temperature,
        top_p=c.rollout.top_p,
        instruction=c.data.instruction,
        return_logprobs=True,  # the sampler's own log-probs: mismatch metrics and the correction
    )


def _overlong_shaping(c: RunConfig) -> OverlongShaping | None:
    if not c.reward.overlong_buffer:
        return None
    from tepo.rewards.shaping import overlong_buffer_tokens

    buffer = overlong_buffer_tokens(c.reward.overlong_buffer, c.rollout.max_new_tokens)
    return OverlongShaping(c.rollout.max_new_tokens, buffer, c.reward.overlong_penalty_factor)
