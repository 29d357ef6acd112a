"""One evaluation of the initial policy per *evaluation key*, copied into every run of a comparison that shares it.

The held-out evaluation before training (``eval_before.json``, which the trainer reuses when present, with its
per-problem records ``held_out/before.jsonl``) is computed once per key and copied into every other run with the
same key, including the runs an earlier invocation left in the directory when they ran on the same hardware
(:func:`_same_evaluation_on_disk`, so a study extended by seeds or methods does not score the initial policy
again). The key is "same model, same held-out set, same eval settings" (:func:`eval_sharing_key`): every config
key except those that only affect training (``_NOT_EVAL_KEYS``, the ``algorithm``/``optim``/``log`` sections),
with the held-out set identified by the SHA-256 of its problems (recomputed by the planner from the trainer's own
``load_datasets``). ``train.seed`` stays in the key when ``eval.samples > 0``, because the sampled pass draws from
``10_000 + train.seed``; with greedy-only evaluation (``eval.samples=0``) the seed matters only through the
held-out set, so runs of different seeds share one evaluation when their held-out sets are equal (a file or
benchmark ``eval.source``, or a procedural task's test split drawn with the comparison's ``eval.seed``). Without
the held-out digest (``check_prompts=False``) the seed stays in the key.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tepo.compare.planning import ComparisonPlan, RunSpec, config_digests, flat_config
from tepo.compare.record import discover_runs
from tepo.config import RunConfig, load_config
from tepo.evaluate.records import BEFORE, records_path

# Keys that do not change what the initial policy scores on the held-out set.
_NOT_EVAL_KEYS_PREFIX = ("algorithm.", "optim.", "log.")

_NOT_EVAL_KEYS = {
    "train.steps",
    "train.run_name",
    "train.output_dir",
    "train.save_every",
    "train.save_final",
    "train.keep_last",
    "train.save_optimizer",
    "train.resume_without_optimizer",
    "train.max_bad_steps",
    "train.ppo_epochs",
    "train.mini_batch_prompts",
    "train.micro_batch_size",
    "train.micro_batch_tokens",
    "train.prompts_per_step",
    "rollout.group_size",
    "rollout.temperature",
    "rollout.async_steps",
    "reward.overlong_buffer",
    "reward.overlong_penalty_factor",
    "reward.overlong_filter",
    "eval.every",  # when to evaluate during training, not how
}


def eval_sharing_key(config: RunConfig, held_out_digest: str | None = None) -> str:
    """Runs with equal keys score the initial policy identically: same model, held-out set and eval settings.

    Every config key counts except those that only affect training (``_NOT_EVAL_KEYS`` and the ``algorithm``,
    ``optim`` and ``log`` sections); an unknown new key therefore prevents sharing rather than allowing a wrong
    one. ``held_out_digest`` (the SHA-256 of the held-out problems) stands for the data keys that choose the
    held-out set; ``train.seed`` is dropped from the key only when it is known not to matter: a digest is given
    and the evaluation is greedy only (``eval.samples == 0``; the sampled pass is seeded by ``train.seed``).
    """
    flat = flat_config(config)
    kept = {
        k: v for k, v in flat.items() if not k.startswith(_NOT_EVAL_KEYS_PREFIX) and k not in _NOT_EVAL_KEYS
    }
    if held_out_digest is not None:
        kept["held_out_digest"] = held_out_digest
        if not config.eval.samples:
            kept.pop("train.seed")
    return json.dumps(kept, sort_keys=True, default=str)


def share_eval_before(plan: ComparisonPlan, spec: RunSpec) -> None:
    """Copy an identical run's ``eval_before.json`` into ``spec.run_dir`` (see the module docstring): one of this
    plan's runs, else one an earlier invocation left in the directory."""
    from tepo.training import EVAL_BEFORE

    target = spec.run_dir / EVAL_BEFORE
    if target.exists():
        return
    source = _same_evaluation_in_plan(plan, spec) or _same_evaluation_on_disk(plan, spec)
    if source is not None:
        spec.run_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        # The initial policy's per-problem records go with its scores (runs that predate them have none).
        records = records_path(source.parent, BEFORE)
        if records.exists():
            records_path(spec.run_dir, BEFORE).parent.mkdir(exist_ok=True)
            shutil.copyfile(records, records_path(spec.run_dir, BEFORE))


def _same_evaluation_in_plan(plan: ComparisonPlan, spec: RunSpec) -> Path | None:
    from tepo.training import EVAL_BEFORE

    key = eval_sharing_key(spec.config, spec.held_out_digest)
    for other in plan.runs:
        source = other.run_dir / EVAL_BEFORE
        if (
            other is not spec
            and source.exists()
            and eval_sharing_key(other.config, other.held_out_digest) == key
        ):
            return source
    return None


def _same_evaluation_on_disk(plan: ComparisonPlan, spec: RunSpec) -> Path | None:
    """The ``eval_before.json`` of a run an earlier ``tepo compare`` made in this directory (``comparison.json``
    keeps the union of the plans) that scored the same initial policy the same way *on this kind of machine*.

    Its saved config has the precision it resolved when it ran, so it is compared with the planned config resolved
    here (``auto`` -> this hardware's choice); and its ``precision.json`` must name this hardware, because float
    arithmetic differs between CPU kinds even at one precision. A run without ``precision.json`` (made before it
    was recorded) is never a source. The held-out digest is recomputed from the saved config, as the planner does.
    """
    from tepo.precision import resolve_run_precision
    from tepo.training import EVAL_BEFORE
    from tepo.training.run_dir import read_run_precision
    from tepo.training.setup import run_device

    here = resolve_run_precision(spec.config, run_device(spec.config))
    key = eval_sharing_key(here.config, spec.held_out_digest)
    planned = {run.run_dir for run in plan.runs}
    for seeds in discover_runs(plan.directory).values():
        for run_dir in seeds.values():
            source, recorded = run_dir / EVAL_BEFORE, read_run_precision(run_dir)
            if run_dir in planned or not source.exists() or recorded is None:
                continue
            if (recorded.get("hardware"), recorded.get("native_bf16")) != (
                here.precision.hardware,
                here.precision.native_bf16,
            ):
                continue
            saved = load_config(str(run_dir / "config.yaml"))
            digest = config_digests(saved)[1] if spec.held_out_digest is not None else None
            if eval_sharing_key(saved, digest) == key:
                return source
    return None
