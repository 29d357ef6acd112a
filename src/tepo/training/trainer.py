"""The training recipe, shaped like torchtune's single-device recipes: ``setup``, the loop, clean-up.

``Trainer(config, run_dir)`` runs :meth:`Trainer.setup`: it reads the newest intact checkpoint's state first
(when the run directory has one), then builds each part with a ``_setup_*`` method that is handed what it needs
(that state included) and returns what it built: the plan, the model and its reference, the rollout backend, the
optimizer and schedule, the prompt stream. Everything a step uses ends in one :class:`StepParts`, the single
owner of the run's objects (``Trainer.model`` and the like read it). ``run()`` evaluates the initial policy,
runs ``tepo.training.step.train_step`` until ``train.steps``, logs one metrics row per step, checkpoints,
evaluates the trained policy and writes the summary (``tepo.training.summary``). Starting a run and resuming one
from its directory: ``tepo.training.run_dir``; the run's precision: ``tepo.precision.resolve_run_precision``.

Resume: sampling seeds are a function of (seed, step, round) and the prompt stream's position, the RNG state and
the optimizer/schedule are checkpointed, so a resumed run repeats exactly what an uninterrupted one would do.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from tepo.checkpoint import (
    Checkpoint,
    CheckpointState,
    atomic_write_text,
    find_latest_checkpoint,
    load_checkpoint_weights,
    read_checkpoint_state,
    resume_without_optimizer_note,
    rng_state,
    save_checkpoint,
    set_rng_state,
    should_save,
)
from tepo.config import ConfigError, RunConfig, config_warnings
from tepo.data import PromptStream
from tepo.metrics import MetricsLog, truncate_metrics
from tepo.precision import RunPrecision, resolve_run_precision
from tepo.rewards import MathRewardPool, user_reward_functions
from tepo.rollout.base import RolloutBackend, RolloutError
from tepo.training.collect import Collected
from tepo.training.datasets import load_datasets
from tepo.training.evaluation import evaluate_held_out, evaluation_metrics
from tepo.training.overlap import RolloutPrefetch, keep_off_engine_cores, restore_cores
from tepo.training.parts import build_step_parts
from tepo.training.plan import StepPlan, plan_step
from tepo.training.schedule import lr_factor, updates_per_step
from tepo.training.step import collect_step, train_step
from tepo.training.summary import summarize

EVAL_BEFORE = "eval_before.json"


class TrainingStopped(RuntimeError):
    """The run stopped on purpose (too many non-finite steps); the last good checkpoint is intact."""


@dataclass
class TrainResult:
    run_dir: Path
    steps_done: int
    summary: dict


@dataclass(frozen=True)
class _Resume:
    """The checkpoint a run resumes from and its saved state (read first: :meth:`Trainer.setup`); ``exact``:
    False when it holds no optimizer moments and the user accepted that (train.resume_without_optimizer)."""

    checkpoint: Checkpoint
    state: CheckpointState
    exact: bool


@dataclass
class _RunCounters:
    """What the loop counts across steps (checkpointed): steps done, steps in a row without an applied update,
    and the reward pool's counters of earlier processes of this run."""

    step: int = 0
    bad_steps_in_row: int = 0
    reward_base: dict | None = None

    @staticmethod
    def of(resume: _Resume | None) -> _RunCounters:
        base = {"timeouts": 0, "parse_failures": 0}
        if resume is None:
            return _RunCounters(reward_base=base)
        state = resume.state
        return _RunCounters(
            step=int(state["step"]),
            bad_steps_in_row=int(state["bad_steps_in_row"]),
            reward_base={k: int(v) for k, v in state.get("reward_totals", base).items()},
        )


def _enable_activation_checkpointing(model) -> None:
    """Recompute each layer's activations in backward: less memory, same values (docs/performance.md).

    Generation is unaffected: the rollout runs the model in eval mode.
    """
    if hasattr(model, "activation_checkpointing_enable"):  # the transformers 5 name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


class Trainer:
    """One run's parts and its loop. :meth:`setup` builds the parts, :meth:`run` is the loop, its ``finally``
    the clean-up."""

    def __init__(self, config: RunConfig, run_dir: Path, *, log=print, precision: RunPrecision | None = None):
        self.device = run_device(config)  # first: a missing GPU is one line, before anything loads
        # Precision "auto" becomes the hardware's choice here (tepo.precision); train()/resume() pass what they
        # resolved and recorded in the run directory.
        precision = precision or resolve_run_precision(config, self.device)
        self.config: RunConfig = precision.config
        self.precision = precision.precision
        self.run_dir = Path(run_dir)
        self.log = log
        self._pool: MathRewardPool | None = None
        self._prefetch: RolloutPrefetch | None = None  # rollout.async_steps=1: the batch sampled ahead
        self._cpu_before_overlap: tuple | None = None
        self.setup(precision.warnings)

    # ---- set-up ---------------------------------------------------------------------------------------------

    def setup(self, precision_warnings: list[str] = ()) -> None:
        """Build the run: the checkpoint's state first, then every part from it (torchtune's recipe order)."""
        c, log = self.config, self.log
        log(self.precision.banner())
        for note in precision_warnings:
            log(f"warning: {note}")
        for note in config_warnings(c):
            log(f"note: {note}")
        self.train_problems, self.eval_problems = load_datasets(c)
        torch.manual_seed(c.train.seed)
        if c.train.deterministic:  # before the model's first matmul (cuBLAS reads its workspace setting then)
            from tepo.training.determinism import make_deterministic

            log(make_deterministic(self.device))
        resume = self._setup_resume()
        self.plan = self._setup_plan()
        model, ref_model, tokenizer = self._setup_model(resume)
        rollout = self._setup_rollout(model, tokenizer, resume)
        optimizer, scheduler = self._setup_optimizer(model, resume)
        self.parts = build_step_parts(
            c,
            model=model,
            ref_model=ref_model,
            optimizer=optimizer,
            scheduler=scheduler,
            rollout=rollout,
            tokenizer=tokenizer,
            stream=self._setup_stream(resume),
            device=self.device,
            run_dir=self.run_dir,
        )
        if (budget := self.plan.update.passes.micro_batch_tokens) is not None:
            log(
                f"micro-batches: rows sorted by length, at most {budget} computed tokens each "
                "(train.micro_batch_tokens)"
            )
        self.counters = _RunCounters.of(resume)
        self.resumed = resume is not None
        # Recorded in the summary: the step a resume without the optimizer's moments started from.
        self.inexact_resume_at_step = None if resume is None or resume.exact else resume.checkpoint.step
        if resume is not None:
            set_rng_state(
                resume.state["rng"]
            )  # last: building the parts draws from the RNG (LoRA's initial A)
            moved = truncate_metrics(self.run_dir, self.step)
            note = (
                f" ({moved} metrics rows of later steps moved to metrics.rolledback.jsonl)" if moved else ""
            )
            log(f"resumed from {resume.checkpoint.path} at step {self.step}{note}")

    def _setup_resume(self) -> _Resume | None:
        """The newest intact checkpoint and its state (its weights load into the model in :meth:`_setup_model`),
        None for a new run (rows of a run that wrote no checkpoint move to metrics.rolledback.jsonl)."""
        checkpoint = find_latest_checkpoint(self.run_dir, warn=self.log)
        if checkpoint is None:
            moved = truncate_metrics(self.run_dir, 0)
            if moved:
                self.log(
                    f"no intact checkpoint: starting from step 0 ({moved} metrics rows moved to "
                    "metrics.rolledback.jsonl)"
                )
            return None
        # A checkpoint saved without the optimizer's moments is refused (before any weight loads) unless the user
        # acknowledged that such a resume is not exact.
        note = resume_without_optimizer_note(checkpoint, self.config.train.resume_without_optimizer)
        if note is not None:
            self.log(f"note: {note}")
        return _Resume(checkpoint, read_checkpoint_state(checkpoint), exact=note is None)

    def _setup_plan(self) -> StepPlan:
        """Which passes every step runs (tepo.training.plan), decided once; the model's set-up reads it."""
        from tepo.rollout.registry import choose_rollout_backend

        return plan_step(self.config, backend=choose_rollout_backend(self.config.rollout)[0])

    def _setup_model(self, resume: _Resume | None) -> tuple[torch.nn.Module, torch.nn.Module | None, object]:
        """``(policy, reference, tokenizer)``: the policy on the run's device (LoRA adapters where asked, the
        checkpoint's weights when resuming, activation checkpointing), the reference policy where the plan needs
        one (the initial policy: copied before any checkpoint weights load), None otherwise."""
        from tepo.models import load_model_and_tokenizer

        c, log = self.config, self.log
        model, tokenizer = load_model_and_tokenizer(
            c.model.name,
            trust_remote_code=c.model.trust_remote_code,
            dtype=getattr(torch, c.model.dtype),
            device=self.device,
        )
        if self.device.type == "cuda":
            log(device_note(self.device, model))
        # The reference policy: a frozen copy of the model, or with LoRA the policy with its adapters off.
        ref_model = None
        if self.plan.needs_reference_model and c.model.lora.rank <= 0:
            ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        if c.model.lora.rank > 0:
            model, ref_model = self._apply_lora(model)
        if resume is not None:
            load_checkpoint_weights(resume.checkpoint, model)
        model.train()  # no dropout in the supported models (but LoRA's, model.lora.dropout)
        if c.model.gradient_checkpointing:
            _enable_activation_checkpointing(model)
        return model, ref_model, tokenizer

    def _apply_lora(self, model) -> tuple[torch.nn.Module, torch.nn.Module | None]:
        """``(the LoRA policy, its reference)``: the base model with the adapters switched off is the initial
        policy (B starts at zero), no second copy of the model (tepo.lora.AdaptersOff)."""
        from tepo.lora import AdaptersOff, LoraTargetError, apply_lora

        rank = self.config.model.lora.rank
        try:  # a bad target module fails here, before training
            model = apply_lora(model, self.config.model.lora)
        except LoraTargetError as err:
            raise ConfigError(str(err)) from None
        trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
        self.log(f"LoRA rank {rank}: training {trained:,} adapter parameters")
        return model, AdaptersOff(model) if self.plan.needs_reference_model else None

    def _setup_rollout(self, model, tokenizer, resume: _Resume | None) -> RolloutBackend:
        """The rollout backend (with its parity guard, handed to it when built from rollout.parity, where it runs
        a separate engine; the guard's probe and last scores from the checkpoint). The off-policy correction of
        its gap to the trainer is the plan's."""
        from tepo.rollout import make_rollout_from_config

        c, log = self.config, self.log
        rollout = make_rollout_from_config(
            c.rollout, model, tokenizer, seed=c.train.seed, run_dir=self.run_dir, log=log
        )
        if resume is not None:
            # The first sync after a resume is checked like every sync, against the last check before the stop.
            rollout.weights_updated()
            # Checkpoints older than 2026-12-04 hold no guard state: the first check after resuming then tests
            # the gross gap only, and draws the probe anew.
            guard_state = resume.state.get("parity_guard")
            if rollout.parity_guard is not None and guard_state is not None:
                rollout.parity_guard.load_state_dict(guard_state)  # its checks so far are in the kept rows
        if (correction := self.plan.correction) is not None:
            log(f"rollout correction: {correction.mode} {correction.options or '(default thresholds)'}")
        return rollout

    def _setup_optimizer(self, model, resume: _Resume | None) -> tuple:
        """``(optimizer, schedule)``: AdamW over the trained parameters and the learning-rate schedule, with the
        checkpoint's moments and position when resuming."""
        c = self.config
        optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],  # with LoRA: the adapters only
            lr=c.optim.lr,
            betas=c.optim.betas,
            weight_decay=c.optim.weight_decay,
            fused=c.optim.fused,  # the same update as the for-loop kernel, less time and memory
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lr_factor(c, c.train.steps * updates_per_step(c))
        )
        if resume is not None:
            optimizer.load_state_dict(resume.state["optimizer"])
            scheduler.load_state_dict(resume.state["scheduler"])
        return optimizer, scheduler

    def _setup_stream(self, resume: _Resume | None) -> PromptStream:
        """The training prompts in the run's order, at the checkpoint's position when resuming."""
        stream = PromptStream(self.train_problems, seed=self.config.train.seed)
        if resume is not None:
            stream.load_state_dict(resume.state["stream"])
        return stream

    # ---- the parts (owned by self.parts) --------------------------------------------------------------------

    model = property(lambda self: self.parts.model)
    ref_model = property(lambda self: self.parts.ref_model)
    tokenizer = property(lambda self: self.parts.tokenizer)
    rollout = property(lambda self: self.parts.rollout)
    optimizer = property(lambda self: self.parts.optimizer)
    scheduler = property(lambda self: self.parts.scheduler)
    stream = property(lambda self: self.parts.stream)

    @property
    def step(self) -> int:
        return self.counters.step

    @property
    def bad_steps_in_row(self) -> int:
        return self.counters.bad_steps_in_row

    # ---- checkpoints ----------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        guard = self.rollout.parity_guard
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng_state(),
            # With a batch in flight, the stream has moved past prompts no finished step used: record the position
            # before them, so a resumed run samples them again.
            "stream": (
                self._prefetch.stream_state
                if self._prefetch is not None and self._prefetch.stream_state is not None
                else self.stream.state_dict()
            ),
            "bad_steps_in_row": self.counters.bad_steps_in_row,
            "reward_totals": self.reward_totals(),
            **({"parity_guard": guard.state_dict()} if guard is not None else {}),
        }

    def reward_totals(self) -> dict:
        """Timeouts and parse failures of the whole run: earlier processes' plus this process's pool."""
        stats = self._pool.stats if self._pool is not None else None
        base = self.counters.reward_base
        return {
            "timeouts": base["timeouts"] + (stats.timeouts if stats else 0),
            "parse_failures": base["parse_failures"] + (stats.parse_failures if stats else 0),
        }

    def save(self) -> Path:
        t = self.config.train
        return save_checkpoint(
            self.run_dir,
            self.step,
            self.model,
            self.state_dict(),
            t.keep_last,
            save_optimizer=t.save_optimizer,
        )

    # ---- the loop -------------------------------------------------------------------------------------------

    def start_overlap(self, pool) -> None:
        """With ``rollout.async_steps=1``, sample ahead from now on (see :meth:`next_batch`)."""
        if self.config.rollout.async_steps and self._prefetch is None:
            self._cpu_before_overlap = keep_off_engine_cores(self.rollout, self.log)
            self._prefetch = RolloutPrefetch(self.parts, pool)

    def stop_overlap(self) -> None:
        if self._prefetch is not None:
            self._prefetch.close()
            self._prefetch = None
        if self._cpu_before_overlap is not None:
            restore_cores(self._cpu_before_overlap)
            self._cpu_before_overlap = None

    def next_batch(self, pool) -> Collected | None:
        """With overlapped rollouts: this step's batch (sampled during the last update, or now for a run's first
        step), after starting the next step's in the background. None in the synchronous loop (the step samples)."""
        if self._prefetch is None:
            return None
        collected = self._prefetch.take(self.step)
        if collected is None:  # the first step of this process: nothing was sampled ahead
            collected = collect_step(self.parts, pool, self.step)
        if self.step + 1 < self.config.train.steps:
            copy_seconds = self._prefetch.start(self.step + 1)
            collected.metrics["time/rollout_stage_seconds"] = copy_seconds
        return collected

    def evaluate(self, pool, *, pass_k: bool = False) -> dict:
        """Held-out scores; ``pass_k``: with pass@k too (the initial and the trained policy's, not the others)."""
        return evaluate_held_out(
            self.rollout, self.tokenizer, self.eval_problems, pool, self.config, pass_k=pass_k
        )

    def run(self) -> TrainResult:
        c = self.config
        metrics_log = MetricsLog(
            self.run_dir,
            tensorboard=c.log.tensorboard,
            wandb=c.log.wandb,
            wandb_project=c.log.wandb_project,
            config=c.to_dict(),
        )
        progress = None
        try:
            with MathRewardPool(
                num_workers=c.reward.num_workers,
                timeout_s=c.reward.timeout_s,
                answer_format=c.reward.answer_format,
                functions=[f.for_pool() for f in user_reward_functions(c.reward.functions)],
            ) as pool:
                self._pool = pool
                self._doing = "the initial policy's held-out evaluation"
                before = self._initial_evaluation(pool)
                progress = _progress_bar(c, initial=self.step)
                self.start_overlap(pool)
                while self.step < c.train.steps:
                    self._one_step(pool, metrics_log, progress)
                progress.close()
                if self.eval_problems:
                    self.log("evaluating the trained policy")
                self._doing = "the trained policy's held-out evaluation"
                after = self.evaluate(pool, pass_k=True)
        except RolloutError as err:
            # The step's row was not logged and no checkpoint was written for it: `--resume` redoes that step.
            raise err.add_context(self._doing) from None
        finally:  # clean-up
            self.stop_overlap()
            if progress is not None:
                progress.close()
            metrics_log.close()
            self.rollout.close()  # the vLLM backend's server process
        return self._finish(before, after)

    def _one_step(self, pool, metrics_log: MetricsLog, progress) -> None:
        """One step of the loop: the step itself, its evaluation when due, its metrics row, its checkpoint."""
        c = self.config
        started = time.perf_counter()
        self._doing = f"step {self.step + 1}'s rollout"
        row = train_step(self.parts, self.plan, pool, self.step, self.next_batch(pool))
        row["time/step_seconds"] = time.perf_counter() - started  # waiting for an overlapped batch too
        self.counters.step += 1
        stop = self._count_bad_step(row)
        if stop is None and c.eval.every and self.step % c.eval.every == 0 and self.step < c.train.steps:
            if self._prefetch is not None:
                self._prefetch.settle()  # the engine is needed for the evaluation
            self._doing = f"the held-out evaluation after step {self.step}"
            row.update(evaluation_metrics(self.evaluate(pool)))
        row["update/bad_steps_in_row"] = self.bad_steps_in_row
        totals = self.reward_totals()
        row["reward/timeouts_total"] = totals["timeouts"]
        row["reward/parse_failures_total"] = totals["parse_failures"]
        metrics_log.append(row)  # the stopping step is logged too; it writes no checkpoint
        if stop is not None:
            raise stop
        if should_save(self.step, c.train.steps, c.train.save_every, c.train.save_final):
            self.save()
        progress.update(1)
        progress.set_postfix(
            reward=f"{row['reward/mean']:.2f}",
            entropy=f"{row.get('update/entropy_mean', float('nan')):.2f}",
            s_per_step=f"{row.get('time/step_seconds', 0):.1f}",
        )

    def _finish(self, before: dict, after: dict) -> TrainResult:
        """The summary (written atomically) and the result of the run."""
        summary = summarize(self.run_dir, before, after)
        summary["precision"] = self.precision.as_dict()
        if self.inexact_resume_at_step is not None:
            summary["resumed_without_optimizer_at_step"] = self.inexact_resume_at_step
        atomic_write_text(self.run_dir / "summary.json", json.dumps(summary, indent=2))
        if self.resumed:
            summary["resumed"] = True
        return TrainResult(run_dir=self.run_dir, steps_done=self.step, summary=summary)

    def _initial_evaluation(self, pool) -> dict:
        """The initial policy's held-out scores, computed once per run (a resumed run reads them back)."""
        before_path = self.run_dir / EVAL_BEFORE
        if before_path.exists():
            return json.loads(before_path.read_text())
        if self.eval_problems:
            self.log(f"evaluating the initial policy on {len(self.eval_problems)} held-out problems")
        before = self.evaluate(pool, pass_k=True)
        atomic_write_text(before_path, json.dumps(before))
        return before

    def _count_bad_step(self, row: dict) -> TrainingStopped | None:
        """Count steps with no applied update in a row; the error to raise (after logging) at the limit."""
        if row.get("update/skipped_updates") and not row.get("update/optimizer_updates"):
            self.counters.bad_steps_in_row += 1
        else:
            self.counters.bad_steps_in_row = 0
        if self.bad_steps_in_row >= self.config.train.max_bad_steps:
            return TrainingStopped(
                f"{self.bad_steps_in_row} steps in a row had a non-finite loss or gradient and were not applied; "
                f"stopping. The last good checkpoint in {self.run_dir / 'checkpoints'} is intact."
            )
        return None


def _progress_bar(config: RunConfig, initial: int):
    from tqdm.auto import tqdm

    return tqdm(
        total=config.train.steps,
        initial=initial,
        desc="train",
        unit="step",
        disable=not config.log.progress,
        file=sys.stderr,
        dynamic_ncols=True,
    )


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
