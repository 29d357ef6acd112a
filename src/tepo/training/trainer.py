"""The training recipe, shaped like torchtune's single-device recipes: ``setup``, the loop, clean-up.

``Trainer(config, run_dir)`` holds the run's settings; :meth:`Trainer.setup` builds the run: it reads the newest
intact checkpoint's state first (when the run directory has one), then builds each part with a function of
``tepo.training.setup`` that is handed its config section and that state and returns what it built: the plan,
the model and its reference, the rollout backend, the optimizer and schedule, the prompt stream. Everything a
step uses ends in one :class:`StepParts`, the single owner of the run's objects (``Trainer.model`` and the like
read it). :meth:`Trainer.run` is the loop: it evaluates the initial policy, runs
``tepo.training.step.train_step`` until ``train.steps``, logs one metrics row per step, checkpoints, evaluates
the trained policy and writes the summary (``tepo.training.summary``). Starting a run and resuming one from its
directory: ``tepo.training.run_dir``; the run's precision: ``tepo.precision.resolve_run_precision``.

Resume: sampling seeds are a function of (seed, step, round) and the prompt stream's position, the RNG state and
the optimizer/schedule are checkpointed, so a resumed run repeats exactly what an uninterrupted one would do.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from tepo.checkpoint import (
    BAD_STEPS_KEY,
    OPTIMIZER_KEY,
    PARITY_GUARD_KEY,
    REWARD_TOTALS_KEY,
    RNG_KEY,
    SCHEDULER_KEY,
    STREAM_KEY,
    atomic_write_text,
    rng_state,
    save_checkpoint,
    set_rng_state,
    should_save,
)
from tepo.config import RunConfig, config_warnings
from tepo.evaluate.records import AFTER, BEFORE, records_path
from tepo.metrics import MetricsLog, truncate_metrics
from tepo.precision import RunPrecision, resolve_run_precision
from tepo.rewards import FAILURES_FILE, RewardFailures, RewardPool, user_reward_functions
from tepo.rewards.functions import runs_math_verify
from tepo.rollout.base import RolloutError
from tepo.training.collect import Collected
from tepo.training.datasets import held_out_note, load_datasets
from tepo.training.evaluation import evaluate_held_out
from tepo.training.overlap import RolloutPrefetch, keep_off_engine_cores, restore_cores
from tepo.training.parts import build_step_parts
from tepo.training.plan import plan_step
from tepo.training.setup import (
    Resume,
    RunCounters,
    run_device,
    setup_model,
    setup_optimizer,
    setup_resume,
    setup_rollout,
    setup_stream,
)
from tepo.training.step import collect_step, train_step
from tepo.training.summary import scores_from_disk, scores_on_disk, summarize

EVAL_BEFORE = "eval_before.json"


class TrainingStopped(RuntimeError):
    """The run stopped on purpose (too many non-finite steps); the last good checkpoint is intact."""


@dataclass
class TrainResult:
    run_dir: Path
    steps_done: int
    summary: dict


class Trainer:
    """One run's parts and its loop. :meth:`setup` builds the parts, :meth:`run` is the loop, its ``finally``
    the clean-up."""

    def __init__(self, config: RunConfig, run_dir: Path, *, log=print, precision: RunPrecision | None = None):
        self.device = run_device(config)  # first: a missing GPU is one line, before anything loads
        # Precision "auto" becomes the hardware's choice here (tepo.precision); train()/resume() pass what they
        # resolved and recorded in the run directory.
        self._precision = precision or resolve_run_precision(config, self.device)
        self.config: RunConfig = self._precision.config
        self.precision = self._precision.precision
        self.run_dir = Path(run_dir)
        self.log = log
        self._pool: RewardPool | None = None
        self._prefetch: RolloutPrefetch | None = None  # rollout.async_steps=1: the batch sampled ahead
        self._cpu_before_overlap: tuple | None = None

    # ---- set-up ---------------------------------------------------------------------------------------------

    def setup(self) -> Trainer:
        """Build the run: the checkpoint's state first, then every part from it (torchtune's recipe order).
        Returns the trainer, ready to :meth:`run`."""
        c, log = self.config, self.log
        log(self.precision.banner())
        for note in self._precision.warnings:
            log(f"warning: {note}")
        for note in config_warnings(c):
            log(f"note: {note}")
        self.train_problems, self.eval_problems = load_datasets(c)
        if (held_out := held_out_note(c, len(self.train_problems))) is not None:
            log(f"note: {held_out}")
        torch.manual_seed(c.train.seed)
        if c.train.deterministic:  # before the model's first matmul (cuBLAS reads its workspace setting then)
            from tepo.training.determinism import make_deterministic

            log(make_deterministic(self.device))
        resume = setup_resume(self.run_dir, c.train.resume_without_optimizer, log)
        self.plan = self._setup_plan()
        model, ref_model, tokenizer = setup_model(c.model, self.plan, self.device, resume, log)
        rollout = setup_rollout(
            c.rollout,
            self.plan,
            model,
            tokenizer,
            seed=c.train.seed,
            run_dir=self.run_dir,
            resume=resume,
            log=log,
        )
        optimizer, scheduler = setup_optimizer(c, model, resume)
        self.parts = build_step_parts(
            c,
            model=model,
            ref_model=ref_model,
            optimizer=optimizer,
            scheduler=scheduler,
            rollout=rollout,
            tokenizer=tokenizer,
            stream=setup_stream(self.train_problems, c.train.seed, resume),
            device=self.device,
            run_dir=self.run_dir,
        )
        if (budget := self.plan.update.passes.micro_batch_tokens) is not None:
            log(
                f"micro-batches: rows sorted by length, at most {budget} computed tokens each (train.micro_batch_tokens)"
            )
        self.counters = RunCounters.of(resume)
        self.resumed = resume is not None
        # Recorded in the summary: the step a resume without the optimizer's moments started from.
        self.inexact_resume_at_step = None if resume is None or resume.exact else resume.checkpoint.step
        if resume is not None:
            set_rng_state(
                resume.state[RNG_KEY]
            )  # last: building the parts draws from the RNG (LoRA's initial A)
        self._roll_back_metrics(resume)
        return self

    def _setup_plan(self):
        """Which passes every step runs (tepo.training.plan), decided once; the model's set-up reads it."""
        from tepo.rollout.registry import choose_rollout_backend

        return plan_step(self.config, backend=choose_rollout_backend(self.config.rollout)[0])

    def _roll_back_metrics(self, resume: Resume | None) -> None:
        """Move the metrics rows of steps after the run's restart point (the checkpoint's step, or 0 without one)
        to metrics.rolledback.jsonl, and say where the run starts."""
        moved = truncate_metrics(self.run_dir, self.step)
        note = f"{moved} metrics rows of later steps moved to metrics.rolledback.jsonl" if moved else ""
        if resume is not None:
            self.log(
                f"resumed from {resume.checkpoint.path} at step {self.step}" + (f" ({note})" if note else "")
            )
        elif note:
            self.log(f"no intact checkpoint: starting from step 0 ({note})")

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
            OPTIMIZER_KEY: self.optimizer.state_dict(),
            SCHEDULER_KEY: self.scheduler.state_dict(),
            RNG_KEY: rng_state(),
            # With a batch in flight, the stream has moved past prompts no finished step used: record the position
            # before them, so a resumed run samples them again.
            STREAM_KEY: (
                self._prefetch.stream_state
                if self._prefetch is not None and self._prefetch.stream_state is not None
                else self.stream.state_dict()
            ),
            BAD_STEPS_KEY: self.counters.bad_steps_in_row,
            REWARD_TOTALS_KEY: self.reward_totals(),
            **({PARITY_GUARD_KEY: guard.state_dict()} if guard is not None else {}),
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

    def evaluate(self, pool, label: str, *, pass_k: bool = False) -> dict:
        """Held-out scores, each problem's outcome written to ``held_out/<label>.jsonl``; ``pass_k``: with pass@k
        too (the initial and the trained policy's, not the others)."""
        return evaluate_held_out(
            self.rollout,
            self.tokenizer,
            self.eval_problems,
            pool,
            self.config,
            pass_k=pass_k,
            records_path=records_path(self.run_dir, label),
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
            with RewardPool(
                num_workers=c.reward.num_workers,
                timeout_s=c.reward.timeout_s,
                answer_format=c.reward.answer_format,
                functions=[f.for_pool() for f in user_reward_functions(c.reward.functions)],
                log_dir=self.run_dir,  # each worker's prints: reward_worker_<slot>.log
                failures=self._reward_failures(),
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
                after = self.evaluate(pool, AFTER, pass_k=True)
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

    def _reward_failures(self) -> RewardFailures:
        """The record of the user's reward functions' failures: a warning, reward_failures.jsonl, and
        ``RewardFunctionsFailing`` (exit 2) at ``reward.stop_failure_share``; the last checkpoint is kept."""
        return RewardFailures(
            self.run_dir / FAILURES_FILE,
            stop_share=self.config.reward.stop_failure_share,
            log=self.log,
            resume_hint=f"once it is fixed, resume from the last checkpoint with `tepo train --resume {self.run_dir}`",
        )

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
            row.update(self.evaluate(pool, f"step{self.step}"))
        row["update/bad_steps_in_row"] = self.bad_steps_in_row
        if runs_math_verify([name for name, _ in self.parts.settings.reward_functions]):
            totals = self.reward_totals()  # math-verify's: not logged where it does not score the rewards
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
        if self.resumed:
            summary["resumed"] = True
        atomic_write_text(self.run_dir / "summary.json", json.dumps(summary, indent=2))
        return TrainResult(run_dir=self.run_dir, steps_done=self.step, summary=summary)

    def _initial_evaluation(self, pool) -> dict:
        """The initial policy's held-out scores, computed once per run (a resumed run reads them back)."""
        before_path = self.run_dir / EVAL_BEFORE
        if before_path.exists():
            return scores_from_disk(json.loads(before_path.read_text()))
        if self.eval_problems:
            self.log(f"evaluating the initial policy on {len(self.eval_problems)} held-out problems")
        before = self.evaluate(pool, BEFORE, pass_k=True)
        atomic_write_text(before_path, json.dumps(scores_on_disk(before)))
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
