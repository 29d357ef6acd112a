"""Run a planned comparison: every run trained, reused (finished), resumed (interrupted) or restarted.

Reuse: a run with ``summary.json`` is finished and reused (its saved config must equal the planned one); a run
with a config but no summary was interrupted and is resumed from its last intact checkpoint
(``tepo.training.resume``); without an intact checkpoint (or with none at all: ``train.save_every=0``) its
partial metrics are moved aside and it restarts from step 0, reusing its ``eval_before.json``. The plan is
:mod:`tepo.compare.planning`, the directory's record :mod:`tepo.compare.record`, the shared initial evaluation
:mod:`tepo.compare.sharing`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from tepo.compare.planning import ComparisonPlan, RunSpec, flat_config
from tepo.compare.record import run_state, write_plan
from tepo.compare.sharing import share_eval_before
from tepo.config import ConfigError, RunConfig, load_config
from tepo.rewards.shaping import overlong_buffer_tokens
from tepo.training.micro_batches import resolve_micro_batch_tokens


@dataclass
class RunOutcome:
    spec: RunSpec
    action: str  # "reused" | "resumed" | "restarted" | "trained"
    seconds: float


# Precision "auto" resolves when a run starts (tepo.precision) and the run directory keeps the value it resolved
# to: a planned "auto" matches whatever a started run recorded (the table shows each run's precision).
_PRECISION_KEYS = ("model.autocast_bf16", "rollout.autocast_bf16", "rollout.vllm.dtype")


def _config_differences(saved: RunConfig, planned: RunConfig) -> list[str]:
    a, b = flat_config(saved), flat_config(planned)
    # train.micro_batch_tokens "auto" is a function of rollout.max_new_tokens (tepo.training.micro_batches): compare
    # the layouts the two configs run with, so a planned auto matches a run saved with the None it resolves to.
    # reward.overlong_buffer may be a share of the limit (the dapo preset's 0.2): compare the tokens it resolves to,
    # so a run saved with 13 at 64 tokens is the planned run.
    for flat in (a, b):
        flat["train.micro_batch_tokens"] = resolve_micro_batch_tokens(
            flat.get("train.micro_batch_tokens"), flat.get("rollout.max_new_tokens", 0)
        )
        flat["reward.overlong_buffer"] = overlong_buffer_tokens(
            flat.get("reward.overlong_buffer", 0), flat.get("rollout.max_new_tokens", 0)
        )
    # eval.pass_k_samples adds measures at the start and the end and changes nothing else (its own sampling seed): a
    # finished run without them is the same run, and the table shows pass@k for the runs that have it.
    ignore = {"log.progress", "eval.pass_k_samples"} | {k for k in _PRECISION_KEYS if b.get(k) == "auto"}
    return sorted(k for k in a.keys() | b.keys() if k not in ignore and a.get(k) != b.get(k))


def run_one(
    plan: ComparisonPlan, spec: RunSpec, *, train_fn: Callable, resume_fn: Callable, log=print
) -> RunOutcome:
    from tepo.checkpoint import find_latest_checkpoint

    start = time.perf_counter()
    state = run_state(spec.run_dir)
    if state != "new":
        saved = load_config(str(spec.run_dir / "config.yaml"))
        diffs = _config_differences(saved, spec.config)
        if diffs:
            hint = (
                "; it was scored on its own seed's held-out draw, which --eval-seed none plans again"
                if "eval.seed" in diffs and saved.eval.seed is None
                else ""
            )
            raise ConfigError(
                f"{spec.run_dir} holds a run with different settings ({', '.join(diffs)}){hint}; "
                "move it away or use another comparison directory"
            )
    if state == "finished":
        return RunOutcome(spec, "reused", 0.0)
    if state == "interrupted":
        if find_latest_checkpoint(spec.run_dir, warn=log) is not None:
            log(f"[compare] resuming {spec.run_dir}")
            resume_fn(spec.run_dir)
            return RunOutcome(spec, "resumed", time.perf_counter() - start)
        # No intact checkpoint: the run restarts from step 0; keep its partial log, out of the way.
        metrics = spec.run_dir / "metrics.jsonl"
        if metrics.exists():
            aside = spec.run_dir / f"metrics.restarted-{int(time.time())}.jsonl"
            metrics.rename(aside)
            log(
                f"[compare] {spec.run_dir}: no intact checkpoint; restarting (partial metrics kept in {aside.name})"
            )
        share_eval_before(plan, spec)
        train_fn(spec.config, run_dir=spec.run_dir)
        return RunOutcome(spec, "restarted", time.perf_counter() - start)
    share_eval_before(plan, spec)
    log(f"[compare] training {spec.method} seed {spec.seed} -> {spec.run_dir}")
    train_fn(spec.config, run_dir=spec.run_dir)
    return RunOutcome(spec, "trained", time.perf_counter() - start)


def run_comparison(
    plan: ComparisonPlan, *, train_fn: Callable | None = None, resume_fn: Callable | None = None, log=print
) -> list[RunOutcome]:
    """Run (or reuse/resume) every run of the plan, seed by seed so an interrupted comparison stays balanced."""
    if train_fn is None or resume_fn is None:
        from tepo import training as train_module

        train_fn = train_fn or train_module.train
        resume_fn = resume_fn or train_module.resume
    write_plan(plan)
    outcomes = []
    for seed in plan.seeds:
        for spec in (r for r in plan.runs if r.seed == seed):
            outcomes.append(run_one(plan, spec, train_fn=train_fn, resume_fn=resume_fn, log=log))
    return outcomes
