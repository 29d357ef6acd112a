"""The training recipe: set-up, the loop over steps, clean-up; checkpoints and resume.

``Trainer(config, run_dir)`` builds every part of a run (data, model, reference model, rollout backend, optimizer,
schedule, prompt stream); ``run()`` evaluates the initial policy, runs ``tepo.training.step.train_step`` until
``train.steps``, logs one metrics row per step, checkpoints, evaluates the trained policy and writes a summary.

Resume: sampling seeds are a function of (seed, step, round) and the prompt stream's position, the RNG state and
the optimizer/schedule are checkpointed, so a resumed run repeats exactly what an uninterrupted one would do.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import torch

from tepo.checkpoint import (
    atomic_write_text,
    find_latest_checkpoint,
    load_checkpoint,
    resume_without_optimizer_note,
    rng_state,
    save_checkpoint,
    set_rng_state,
    should_save,
)
from tepo.config import (
    ConfigError,
    RunConfig,
    config_warnings,
    load_config,
    save_config,
)
from tepo.data import PromptStream
from tepo.metrics import MetricsLog, read_metrics, truncate_metrics
from tepo.precision import Precision, resolve_precision
from tepo.rewards import MathRewardPool
from tepo.rollout.base import RolloutError
from tepo.training.collect import Collected
from tepo.training.datasets import load_datasets
from tepo.training.evaluation import evaluate_held_out
from tepo.training.overlap import RolloutPrefetch, keep_off_engine_cores, restore_cores
from tepo.training.parts import StepParts, build_step_parts
from tepo.training.plan import StepPlan, plan_step
from tepo.training.schedule import lr_factor, updates_per_step
from tepo.training.step import collect_step, train_step

EVAL_BEFORE = "eval_before.json"


class TrainingStopped(RuntimeError):
    """The run stopped on purpose (too many non-finite steps); the last good checkpoint is intact."""


@dataclass
class TrainResult:
    run_dir: Path
    steps_done: int
    summary: dict


def make_run_dir(config: RunConfig) -> Path:
    name = config.train.run_name or f"{datetime.now():%Y%m%d-%H%M%S}-{config.algorithm.loss}"
    run_dir = Path(config.train.output_dir) / name
    if (run_dir / "metrics.jsonl").exists():
        raise ConfigError(f"run directory {run_dir} already holds a run; resume it with --resume {run_dir}")
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def _enable_activation_checkpointing(model) -> None:
    """Recompute each layer's activations in backward: less memory, same values (docs/performance.md).

    Generation is unaffected: the rollout runs the model in eval mode.
    """
    if hasattr(model, "activation_checkpointing_enable"):  # the transformers 5 name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


class Trainer:
    """One run's parts and its loop. ``__init__`` is the set-up, ``run`` the loop, its ``finally`` the clean-up."""

    # ---- set-up ---------------------------------------------------------------------------------------------

    def __init__(self, config: RunConfig, run_dir: Path, *, log=print, precision: RunPrecision | None = None):
        self.device = run_device(config)  # first: a missing GPU is one line, before anything loads
        # Precision "auto" becomes the hardware's choice here (tepo.precision); train()/resume() pass what they
        # resolved and recorded in the run directory.
        precision = precision or resolve_run_precision(config, self.device)
        c = self.config = precision.config
        self.precision = precision.precision
        self.run_dir = Path(run_dir)
        self.log = log
        log(self.precision.banner())
        for note in precision.warnings:
            log(f"warning: {note}")
        for note in config_warnings(c):
            log(f"note: {note}")
        self.train_problems, self.eval_problems = load_datasets(c)
        torch.manual_seed(c.train.seed)
        if c.train.deterministic:  # before the model's first matmul (cuBLAS reads its workspace setting then)
            from tepo.training.determinism import make_deterministic

            log(make_deterministic(self.device))

        self.plan = self._plan()
        self._setup_model()
        self._setup_rollout()
        self._setup_optimizer()
        self.parts = self._setup_step_parts()
        if (budget := self.parts.logprob_settings.micro_batch_tokens) is not None:
            log(
                f"micro-batches: rows sorted by length, at most {budget} computed tokens each (train.micro_batch_tokens)"
            )

        self.step = 0
        self.bad_steps_in_row = 0
        self.reward_base = {"timeouts": 0, "parse_failures": 0}  # earlier processes' counters of this run
        self._pool: MathRewardPool | None = None
        self._prefetch: RolloutPrefetch | None = None  # rollout.async_steps=1: the batch sampled ahead
        self._cpu_before_overlap: tuple | None = None
        self.inexact_resume_at_step: int | None = None  # set when resumed without the optimizer's moments

    def _plan(self) -> StepPlan:
        """Which passes every step runs (tepo.training.plan), decided once: the reference model's set-up reads it."""
        from tepo.rollout.registry import choose_rollout_backend

        return plan_step(self.config, backend=choose_rollout_backend(self.config.rollout)[0])

    def _setup_model(self) -> None:
        """The policy on the run's device (LoRA adapters where asked), the reference policy where the algorithm needs
        one, activation checkpointing."""
        from tepo.models import load_model_and_tokenizer

        c, log = self.config, self.log
        self.model, self.tokenizer = load_model_and_tokenizer(
            c.model.name,
            trust_remote_code=c.model.trust_remote_code,
            dtype=getattr(torch, c.model.dtype),
            device=self.device,
        )
        if self.device.type == "cuda":
            log(device_note(self.device, self.model))
        # The reference policy: a frozen copy of the model, or with LoRA the policy with its adapters off.
        self.ref_model = None
        if self.plan.needs_reference_model and c.model.lora.rank <= 0:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        if c.model.lora.rank > 0:
            from tepo.lora import LoraTargetError, apply_lora

            try:  # a bad target module fails here, before training
                self.model = apply_lora(self.model, c.model.lora)
            except LoraTargetError as err:
                raise ConfigError(str(err)) from None
            trained = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
            log(f"LoRA rank {c.model.lora.rank}: training {trained:,} adapter parameters")
            if self.plan.needs_reference_model:
                from tepo.lora import AdaptersOff

                # The base model with the adapters switched off is the initial policy (B starts at zero):
                # no second copy of the model (tepo.lora.AdaptersOff).
                self.ref_model = AdaptersOff(self.model)
        self.model.train()  # no dropout in the supported models (but LoRA's, model.lora.dropout)
        if c.model.gradient_checkpointing:
            _enable_activation_checkpointing(self.model)

    def _setup_rollout(self) -> None:
        """The rollout backend (its parity guard where it runs a separate engine); the off-policy correction of its
        gap to the trainer is the plan's."""
        from tepo.rollout import make_rollout_from_config

        c, log = self.config, self.log
        self.rollout = make_rollout_from_config(
            c.rollout, self.model, self.tokenizer, seed=c.train.seed, run_dir=self.run_dir, log=log
        )
        if c.rollout.parity.check and hasattr(self.rollout, "parity_guard"):
            from tepo.rollout.parity import ParityGuard

            # Every weight sync checks that the engine samples the trained weights (tepo.rollout.parity).
            self.rollout.parity_guard = ParityGuard(
                c.rollout.parity.max_gap,
                min_shift=c.rollout.parity.min_shift,
                min_share=c.rollout.parity.min_share,
                engine_dtype=getattr(torch, self.rollout.dtype),
            )
        # Off-policy correction of the sampler/trainer gap (auto: on where another engine samples).
        if (correction := self.plan.correction) is not None:
            log(f"rollout correction: {correction.mode} {correction.options or '(default thresholds)'}")

    def _setup_optimizer(self) -> None:
        """AdamW over the trained parameters, the learning-rate schedule, the prompt stream."""
        c = self.config
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],  # with LoRA: the adapters only
            lr=c.optim.lr,
            betas=c.optim.betas,
            weight_decay=c.optim.weight_decay,
            fused=c.optim.fused,  # the same update as the for-loop kernel, less time and memory
        )
        self.updates_per_step = updates_per_step(c)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_factor(c, c.train.steps * self.updates_per_step)
        )
        self.stream = PromptStream(self.train_problems, seed=c.train.seed)

    def _setup_step_parts(self) -> StepParts:
        """What every step is handed (tepo.training.parts): the run's parts and how each phase runs."""
        return build_step_parts(
            self.config,
            self.plan,
            model=self.model,
            ref_model=self.ref_model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            rollout=self.rollout,
            tokenizer=self.tokenizer,
            stream=self.stream,
            device=self.device,
            run_dir=self.run_dir,
        )

    # ---- checkpoints ----------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
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
            "bad_steps_in_row": self.bad_steps_in_row,
            "reward_totals": self.reward_totals(),
            **({"parity_guard": guard.state_dict()} if (guard := self._parity_guard()) is not None else {}),
        }

    def _parity_guard(self):
        return getattr(self.rollout, "parity_guard", None)

    def reward_totals(self) -> dict:
        """Timeouts and parse failures of the whole run: earlier processes' plus this process's pool."""
        stats = self._pool.stats if self._pool is not None else None
        return {
            "timeouts": self.reward_base["timeouts"] + (stats.timeouts if stats else 0),
            "parse_failures": self.reward_base["parse_failures"] + (stats.parse_failures if stats else 0),
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

    def restore(self) -> bool:
        """Continue from the newest intact checkpoint (rows of later steps move to metrics.rolledback.jsonl)."""
        checkpoint = find_latest_checkpoint(self.run_dir, warn=self.log)
        if checkpoint is None:
            moved = truncate_metrics(self.run_dir, 0)
            if moved:
                self.log(
                    f"no intact checkpoint: starting from step 0 ({moved} metrics rows moved to "
                    "metrics.rolledback.jsonl)"
                )
            return False
        # A checkpoint saved without the optimizer's moments is refused (before any weight loads) unless the user
        # acknowledged that such a resume is not exact.
        note = resume_without_optimizer_note(checkpoint, self.config.train.resume_without_optimizer)
        if note is not None:
            self.log(f"note: {note}")
            self.inexact_resume_at_step = checkpoint.step
        state = load_checkpoint(checkpoint, self.model)
        self.rollout.weights_updated()
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
        self.stream.load_state_dict(state["stream"])
        self.bad_steps_in_row = int(state["bad_steps_in_row"])
        self.reward_base = {k: int(v) for k, v in state.get("reward_totals", self.reward_base).items()}
        # The parity guard's probe and last scores (checkpoints older than 2026-12-04 have none: the first check
        # after resuming then tests the gross gap only, and draws the probe anew).
        if (guard := self._parity_guard()) is not None and state.get("parity_guard") is not None:
            guard.load_state_dict(state["parity_guard"])  # its checks so far are in the kept metrics rows
        self.step = int(state["step"])
        moved = truncate_metrics(self.run_dir, self.step)
        note = f" ({moved} metrics rows of later steps moved to metrics.rolledback.jsonl)" if moved else ""
        self.log(f"resumed from {checkpoint.path} at step {self.step}{note}")
        return True

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
            collected.metrics["rollout_stage_seconds"] = copy_seconds
        return collected

    def evaluate(self, pool, *, pass_k: bool = False) -> dict:
        """Held-out scores; ``pass_k``: with pass@k too (the initial and the trained policy's, not the others)."""
        return evaluate_held_out(
            self.rollout, self.tokenizer, self.eval_problems, pool, self.config, pass_k=pass_k
        )

    def run(self) -> TrainResult:
        c = self.config
        resumed = self.restore()
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
            ) as pool:
                self._pool = pool
                doing = "the initial policy's held-out evaluation"
                before = self._initial_evaluation(pool)
                progress = _progress_bar(c, initial=self.step)
                self.start_overlap(pool)
                while self.step < c.train.steps:
                    started = time.perf_counter()
                    doing = f"step {self.step + 1}'s rollout"
                    row = train_step(self.parts, self.plan, pool, self.step, self.next_batch(pool))
                    row["step_seconds"] = time.perf_counter() - started  # waiting for an overlapped batch too
                    self.step += 1
                    stop = self._count_bad_step(row)
                    if (
                        stop is None
                        and c.eval.every
                        and self.step % c.eval.every == 0
                        and self.step < c.train.steps
                    ):
                        if self._prefetch is not None:
                            self._prefetch.settle()  # the engine is needed for the evaluation
                        doing = f"the held-out evaluation after step {self.step}"
                        row.update(self.evaluate(pool))
                    row["bad_steps_in_row"] = self.bad_steps_in_row
                    totals = self.reward_totals()
                    row["reward_timeouts_total"] = totals["timeouts"]
                    row["reward_parse_failures"] = totals["parse_failures"]
                    metrics_log.append(row)  # the stopping step is logged too; it writes no checkpoint
                    if stop is not None:
                        raise stop
                    if should_save(self.step, c.train.steps, c.train.save_every, c.train.save_final):
                        self.save()
                    progress.update(1)
                    progress.set_postfix(
                        reward=f"{row['reward_mean']:.2f}",
                        entropy=f"{row.get('entropy_mean', float('nan')):.2f}",
                        s_per_step=f"{row.get('step_seconds', 0):.1f}",
                    )
                progress.close()
                if self.eval_problems:
                    self.log("evaluating the trained policy")
                doing = "the trained policy's held-out evaluation"
                after = self.evaluate(pool, pass_k=True)
        except RolloutError as err:
            # The step's row was not logged and no checkpoint was written for it: `--resume` redoes that step.
            raise err.add_context(doing) from None
        finally:  # clean-up
            self.stop_overlap()
            if progress is not None:
                progress.close()
            metrics_log.close()
            self.rollout.close()  # the vLLM backend's server process
        summary = summarize(self.run_dir, before, after)
        summary["precision"] = self.precision.as_dict()
        if self.inexact_resume_at_step is not None:
            summary["resumed_without_optimizer_at_step"] = self.inexact_resume_at_step
        atomic_write_text(self.run_dir / "summary.json", json.dumps(summary, indent=2))
        if resumed:
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
        if row.get("skipped_updates") and not row.get("optimizer_updates"):
            self.bad_steps_in_row += 1
        else:
            self.bad_steps_in_row = 0
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


def summarize(run_dir: Path, before: dict, after: dict) -> dict:
    """The run's headline numbers: held-out scores before/after, reward and entropy trends, median step time."""
    rows = read_metrics(Path(run_dir) / "metrics.jsonl")
    rewards = [r["reward/mean"] for r in rows if isinstance(r.get("reward/mean"), int | float)]
    third = max(1, len(rewards) // 3)
    step_times = [r["time/step_seconds"] for r in rows if isinstance(r.get("time/step_seconds"), int | float)]
    entropies = [
        r["update/entropy_mean"] for r in rows if isinstance(r.get("update/entropy_mean"), int | float)
    ]
    return {
        "steps": len(rows),
        "before": before,
        "after": after,
        "reward_first_third": sum(rewards[:third]) / third if rewards else None,
        "reward_last_third": sum(rewards[-third:]) / third if rewards else None,
        "entropy_first": entropies[0] if entropies else None,
        "entropy_last": entropies[-1] if entropies else None,
        "seconds_per_step_median": sorted(step_times)[len(step_times) // 2] if step_times else None,
    }


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


def train(config: RunConfig, *, run_dir: Path | None = None, log=print) -> TrainResult:
    """Start a new run (or continue ``run_dir`` if it holds one)."""
    device = run_device(config)  # a missing device fails before the run directory is made
    # The run directory records the resolved precision (config.yaml's values, precision.json's reason and
    # hardware): a resumed run keeps it, wherever it resumes.
    precision = resolve_run_precision(config, device)
    config = precision.config
    if run_dir is None:
        run_dir = make_run_dir(config)
        # A new run: write its config even over one left by a start that failed (bad data, a refused model),
        # or a later --resume would use the failed command's settings.
        _save_run_config(config, run_dir, precision.precision)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not (run_dir / "config.yaml").exists():
        _save_run_config(config, run_dir, precision.precision)
    return Trainer(config, run_dir, log=log, precision=precision).run()


def resume(run_dir: Path, overrides: list[str] | None = None, *, log=print) -> TrainResult:
    """Continue a run from its last intact checkpoint, with its saved config (plus overrides, e.g. more steps)."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").exists():
        raise ConfigError(f"{run_dir}: not a run directory (no config.yaml)")
    config = load_config(str(run_dir / "config.yaml"), overrides)
    precision = resolve_run_precision(config, run_device(config), recorded=read_run_precision(run_dir))
    config = precision.config
    if overrides:
        _save_run_config(config, run_dir, precision.precision)
    return Trainer(config, run_dir, log=log, precision=precision).run()


PRECISION_FILE = "precision.json"


@dataclass
class RunPrecision:
    """A run's config with its precision resolved, the resolution, and the warning lines to print at start."""

    config: RunConfig
    precision: Precision
    warnings: list[str]


def resolve_run_precision(config: RunConfig, device, *, recorded: dict | None = None) -> RunPrecision:
    """``config`` with ``model.autocast_bf16``, ``rollout.autocast_bf16`` and ``rollout.vllm.dtype`` resolved for
    ``device`` by :func:`tepo.precision.resolve_precision` (``auto`` -> the hardware's choice).

    ``recorded``: the run directory's ``precision.json`` when resuming. Its values are already in the saved config
    (explicit there), so the run keeps the precision it started with; the reason then says where it was chosen, and
    a precision that is slow on this machine is said in one line instead of the explicit-setting warning.
    """
    import dataclasses

    precision, warnings = resolve_precision(
        config.model.autocast_bf16, config.rollout.autocast_bf16, config.rollout.vllm.dtype, str(device)
    )
    if recorded is not None:
        slow = (
            " (bf16 is emulated on this machine, where it is up to 28x slower than float32)"
            if warnings
            else ""
        )
        warnings = (
            [
                f"this run keeps the precision it started with on {recorded.get('hardware', 'another machine')} "
                f"(recorded in {PRECISION_FILE}){slow}"
            ]
            if warnings or recorded.get("hardware") != precision.hardware
            else []
        )
        precision = dataclasses.replace(
            precision,
            reason=f"kept from the run's start: {recorded.get('reason', '?')}; now on {precision.hardware}",
        )
    resolved = dataclasses.replace(
        config,
        model=dataclasses.replace(config.model, autocast_bf16=precision.model_autocast_bf16),
        rollout=dataclasses.replace(
            config.rollout,
            autocast_bf16=precision.rollout_autocast_bf16,
            vllm=dataclasses.replace(config.rollout.vllm, dtype=precision.vllm_dtype),
        ),
    )
    # Not a field, so replace() dropped it: the renamed keys' notes still reach config_warnings at start.
    resolved.renamed_key_notes = list(getattr(config, "renamed_key_notes", ()))
    return RunPrecision(resolved, precision, warnings)


def _save_run_config(config: RunConfig, run_dir: Path, precision: Precision) -> None:
    save_config(config, Path(run_dir) / "config.yaml", header=precision.banner())
    atomic_write_text(Path(run_dir) / PRECISION_FILE, json.dumps(precision.as_dict(), indent=2))


def read_run_precision(run_dir: Path) -> dict | None:
    """A run directory's recorded precision (None for runs made before it was recorded, 2026-12-05)."""
    path = Path(run_dir) / PRECISION_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
