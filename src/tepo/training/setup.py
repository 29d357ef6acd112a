"""The parts of a training run, each built by one function from its config section and the state it needs.

``Trainer.setup`` (``tepo.training.trainer``) calls them in torchtune's recipe order: the checkpoint's state first
(:func:`setup_resume`), then the model and its reference (:func:`setup_model`), the rollout backend
(:func:`setup_rollout`), the optimizer and schedule (:func:`setup_optimizer`), the prompt stream
(:func:`setup_stream`). Each returns what it built and keeps nothing; the saved state's keys are
``tepo.checkpoint``'s constants.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from tepo.checkpoint import (
    BAD_STEPS_KEY,
    OPTIMIZER_KEY,
    PARITY_GUARD_KEY,
    REWARD_TOTALS_KEY,
    SCHEDULER_KEY,
    STEP_KEY,
    STREAM_KEY,
    Checkpoint,
    CheckpointState,
    find_latest_checkpoint,
    load_checkpoint_weights,
    read_checkpoint_state,
    resume_without_optimizer_note,
)
from tepo.config import ConfigError, ModelConfig, RolloutConfig, RunConfig
from tepo.data import PromptStream
from tepo.rollout.base import RolloutBackend
from tepo.training.plan import StepPlan
from tepo.training.schedule import lr_factor, updates_per_step

Log = Callable[[str], None]


@dataclass(frozen=True)
class Resume:
    """The checkpoint a run resumes from and its saved state (read first); ``exact``: False when it holds no
    optimizer moments and the user accepted that (train.resume_without_optimizer)."""

    checkpoint: Checkpoint
    state: CheckpointState
    exact: bool


@dataclass
class RunCounters:
    """What the loop counts across steps (checkpointed): steps done, steps in a row without an applied update,
    and the reward pool's counters of earlier processes of this run."""

    step: int = 0
    bad_steps_in_row: int = 0
    reward_base: dict | None = None

    @staticmethod
    def of(resume: Resume | None) -> RunCounters:
        base = {"timeouts": 0, "parse_failures": 0}
        if resume is None:
            return RunCounters(reward_base=base)
        state = resume.state
        return RunCounters(
            step=int(state[STEP_KEY]),
            bad_steps_in_row=int(state[BAD_STEPS_KEY]),
            reward_base={k: int(v) for k, v in state.get(REWARD_TOTALS_KEY, base).items()},
        )


def setup_resume(run_dir: Path, resume_without_optimizer: bool, log: Log) -> Resume | None:
    """The newest intact checkpoint of ``run_dir`` and its state (its weights load into the model in
    :func:`setup_model`), None for a new run. A checkpoint saved without the optimizer's moments is refused
    (before any weight loads) unless the user acknowledged that such a resume is not exact
    (``train.resume_without_optimizer``)."""
    checkpoint = find_latest_checkpoint(run_dir, warn=log)
    if checkpoint is None:
        return None
    note = resume_without_optimizer_note(checkpoint, resume_without_optimizer)
    if note is not None:
        log(f"note: {note}")
    return Resume(checkpoint, read_checkpoint_state(checkpoint), exact=note is None)


def setup_model(
    model_config: ModelConfig, plan: StepPlan, device: torch.device, resume: Resume | None, log: Log
) -> tuple[torch.nn.Module, torch.nn.Module | None, object]:
    """``(policy, reference, tokenizer)``: the policy on ``device`` (LoRA adapters where asked, the checkpoint's
    weights when resuming, activation checkpointing), the reference policy where the plan needs one (the initial
    policy: copied before any checkpoint weights load), None otherwise."""
    from tepo.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(
        model_config.name,
        trust_remote_code=model_config.trust_remote_code,
        dtype=getattr(torch, model_config.dtype),
        device=device,
    )
    if device.type == "cuda":
        log(device_note(device, model))
    # The reference policy: a frozen copy of the model, or with LoRA the policy with its adapters off.
    ref_model = None
    if plan.needs_reference_model and model_config.lora.rank <= 0:
        ref_model = copy.deepcopy(model).eval().requires_grad_(False)
    if model_config.lora.rank > 0:
        model, ref_model = _apply_lora(model, model_config, plan, log)
    if resume is not None:
        load_checkpoint_weights(resume.checkpoint, model)
    model.train()  # no dropout in the supported models (but LoRA's, model.lora.dropout)
    if model_config.gradient_checkpointing:
        enable_activation_checkpointing(model)
    return model, ref_model, tokenizer


def _apply_lora(
    model, model_config: ModelConfig, plan: StepPlan, log: Log
) -> tuple[torch.nn.Module, torch.nn.Module | None]:
    """``(the LoRA policy, its reference)``: the base model with the adapters switched off is the initial
    policy (B starts at zero), no second copy of the model (tepo.lora.AdaptersOff)."""
    from tepo.lora import AdaptersOff, LoraTargetError, apply_lora

    try:  # a bad target module fails here, before training
        model = apply_lora(model, model_config.lora)
    except LoraTargetError as err:
        raise ConfigError(str(err)) from None
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log(f"LoRA rank {model_config.lora.rank}: training {trained:,} adapter parameters")
    return model, AdaptersOff(model) if plan.needs_reference_model else None


def enable_activation_checkpointing(model) -> None:
    """Recompute each layer's activations in backward: less memory, same values (docs/performance.md).

    Generation is unaffected: the rollout runs the model in eval mode.
    """
    if hasattr(model, "activation_checkpointing_enable"):  # the transformers 5 name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def setup_rollout(
    rollout_config: RolloutConfig,
    plan: StepPlan,
    model,
    tokenizer,
    *,
    seed: int,
    run_dir: Path,
    resume: Resume | None,
    log: Log,
) -> RolloutBackend:
    """The rollout backend (with its parity guard, handed to it when built from rollout.parity, where it runs
    a separate engine; the guard's probe and last scores from the checkpoint). The off-policy correction of
    its gap to the trainer is the plan's."""
    from tepo.rollout import make_rollout_from_config

    rollout = make_rollout_from_config(rollout_config, model, tokenizer, seed=seed, run_dir=run_dir, log=log)
    if resume is not None:
        # The first sync after a resume is checked like every sync, against the last check before the stop.
        rollout.weights_updated()
        # A checkpoint without the guard's state (one written without a guard) has the first check after
        # resuming test the gross gap only, with the probe drawn anew.
        guard_state = resume.state.get(PARITY_GUARD_KEY)
        if rollout.parity_guard is not None and guard_state is not None:
            rollout.parity_guard.load_state_dict(guard_state)  # its checks so far are in the kept rows
    if (correction := plan.correction) is not None:
        log(f"rollout correction: {correction.mode} {correction.options or '(default thresholds)'}")
    return rollout


def setup_optimizer(config: RunConfig, model, resume: Resume | None) -> tuple:
    """``(optimizer, schedule)``: AdamW over the trained parameters (``optim``) and the learning-rate schedule
    over the run's planned updates, with the checkpoint's moments and position when resuming."""
    optim = config.optim
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],  # with LoRA: the adapters only
        lr=optim.lr,
        betas=optim.betas,
        weight_decay=optim.weight_decay,
        fused=optim.fused,  # the same update as the for-loop kernel, less time and memory
    )
    total_updates = config.train.steps * updates_per_step(config)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(config, total_updates))
    if resume is not None:
        optimizer.load_state_dict(resume.state[OPTIMIZER_KEY])
        scheduler.load_state_dict(resume.state[SCHEDULER_KEY])
    return optimizer, scheduler


def setup_stream(problems: list, seed: int, resume: Resume | None) -> PromptStream:
    """The training prompts in the run's order, at the checkpoint's position when resuming."""
    stream = PromptStream(problems, seed=seed)
    if resume is not None:
        stream.load_state_dict(resume.state[STREAM_KEY])
    return stream


def run_device(config: RunConfig) -> torch.device:
    """``train.device`` on this machine (tepo.device); ConfigError, one line, when the machine lacks it or when
    ``model.dtype`` asks for bf16 weights on the CPU."""
    from tepo.config import bf16_weights_on_cpu_message
    from tepo.device import resolve_device

    try:
        device = resolve_device(config.train.device)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if device.type == "cpu" and config.model.dtype != "float32":
        raise ConfigError(bf16_weights_on_cpu_message(config.model.dtype))
    return device


def device_note(device: torch.device, model) -> str:
    """The start-up line of a CUDA run: the GPU, its memory, and what the weights take of it."""
    props = torch.cuda.get_device_properties(device)
    weights = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30
    return f"training on {device} ({props.name}, {props.total_memory / 2**30:.1f} GiB): weights {weights:.2f} GiB"
