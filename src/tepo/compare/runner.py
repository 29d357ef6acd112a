"""Plan and run a comparison: every method x seed under identical settings, reusing finished runs.

Layout of a comparison directory::

    <comparison_dir>/comparison.json        the plan: methods, seeds, base config, overrides, fairness checks
    <comparison_dir>/<method>/seed<k>/      one ordinary run directory per method and seed
    <comparison_dir>/table.md, table.json   the comparison table (``tepo.compare.table``)

What "identical settings" means here, and how it is checked:

- Every run is built from the same base config (``--config``) and the same ``key=value`` overrides; a method
  contributes only ``algorithm.loss`` / ``algorithm.loss_options`` (a loss name), or, for a preset name such as
  ``tepo_kl``, the keys that preset changes relative to the ``default`` preset. Keys outside ``algorithm`` that a
  preset changes (``tepo_v2_kl_mask`` sets ``train.ppo_epochs``) are listed in ``comparison.json`` and the table
  notes, because they make the comparison about more than the loss.
- The trainer draws the training problems and their order from ``train.seed`` only (``load_problems`` and
  ``PromptStream``), and sampling seeds from ``(train.seed, step, round)``; so runs with the same seed see the
  same prompts in the same order whatever the loss, and step 1's samples are identical (same initial policy,
  same sampling seed). Later samples differ because the policies do. ``plan_comparison`` recomputes the prompt
  schedule of every run from the trainer's own data functions and records its digest: equal digests per seed
  are the check.
- Where it cannot hold: with ``algorithm.dynamic_sampling`` a step draws extra prompt batches when groups are
  dropped, and how many depends on the rewards, so the prompt stream diverges across methods after the first
  refill. The digest then covers only the first draw of each step and the plan says so.
- The held-out evaluation before training (``eval_before.json``, which the trainer reuses when present) is
  computed once per *evaluation key* and copied into every other run with the same key, including the runs an
  earlier invocation left in the directory when they ran on the same hardware (:func:`_same_evaluation_on_disk`,
  so a study extended by seeds or methods does not score the initial policy again). The key is "same model,
  same held-out set, same eval settings" (:func:`eval_sharing_key`): every config key except those that only
  affect training (``_NOT_EVAL_KEYS``, the ``algorithm``/``optim``/``log`` sections), with the held-out set
  identified by the SHA-256 of its problems (recomputed by the planner from the trainer's own ``load_datasets``).
  ``train.seed`` stays in the key when ``eval.samples > 0``, because the sampled pass draws from
  ``10_000 + train.seed``; with greedy-only evaluation (``eval.samples=0``) the seed matters only through the
  held-out set, so runs of different seeds share one evaluation when their held-out sets are equal (a file or
  benchmark ``eval.source``, or a procedural task's test split drawn with the comparison's ``eval.seed``).
- Every run is scored on one held-out draw: ``plan_comparison`` sets ``eval.seed`` (``--eval-seed``, default
  :data:`DEFAULT_EVAL_SEED`) for all of them, and each evaluation writes its per-problem records
  (``tepo.evaluate.records``), which the table pairs problem by problem (``tepo.compare.problems``).
  Without the held-out digest (``check_prompts=False``) the seed stays in the key.

Reuse: a run with ``summary.json`` is finished and reused (its saved config must equal the planned one); a run
with a config but no summary was interrupted and is resumed from its last intact checkpoint
(``tepo.training.resume``); without an intact checkpoint (or with none at all: ``train.save_every=0``) its
partial metrics are moved aside and it restarts from step 0, reusing its ``eval_before.json``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tepo.config import ConfigError, RunConfig, list_presets, load_config
from tepo.evaluate.records import BEFORE, records_path
from tepo.files import atomic_write_text
from tepo.training.micro_batches import resolve_micro_batch_tokens

PLAN_FILE = "comparison.json"
# The held-out draw shared by every run of a comparison (eval.seed): paired differences are then measured on the
# same problems, whatever the training seed.
DEFAULT_EVAL_SEED = 0
# Sections/keys that may differ between the runs of one comparison without making them unfair.
_PER_RUN_KEYS = {"train.seed", "train.run_name", "train.output_dir"}
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


@dataclass
class RunSpec:
    method: str
    seed: int
    run_dir: Path
    config: RunConfig
    held_out_digest: str | None = None  # SHA-256 of the held-out problems (set by the planner)


@dataclass
class ComparisonPlan:
    directory: Path
    methods: list[str]
    seeds: list[int]
    base_config: str
    overrides: list[str]
    runs: list[RunSpec]
    method_changes: dict[str, dict] = field(default_factory=dict)  # method -> {dotted key: value} vs the base
    prompt_digests: dict[str, dict[str, str]] = field(default_factory=dict)  # seed -> method -> digest
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "methods": self.methods,
            "seeds": self.seeds,
            "base_config": self.base_config,
            "overrides": self.overrides,
            "runs": {m: {str(s): f"{m}/seed{s}" for s in self.seeds} for m in self.methods},
            "method_changes": self.method_changes,
            "prompt_digests": self.prompt_digests,
            "notes": self.notes,
        }


# --------------------------------------------------------------------------------------------------------------
# Planning
# --------------------------------------------------------------------------------------------------------------


def parse_seeds(text: str) -> list[int]:
    """``"3"`` -> ``[0, 1, 2]``; ``"0,4,7"`` -> ``[0, 4, 7]``."""
    text = str(text).strip()
    try:
        if "," not in text:
            count = int(text)
            if count < 1:
                raise ValueError
            return list(range(count))
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(
            f"--seeds {text!r}: expected a count >= 1 (e.g. 3) or a comma list of seeds (e.g. 0,1,2)"
        ) from None
    if len(set(seeds)) != len(seeds) or not seeds:
        raise ConfigError(f"--seeds {text!r}: seeds must be distinct and at least one")
    return seeds


def parse_methods(text: str) -> list[str]:
    methods = [m.strip() for m in str(text).split(",") if m.strip()]
    if not methods:
        raise ConfigError("--losses: expected a comma list of losses or presets, e.g. grpo,tepo")
    if len(set(methods)) != len(methods):
        raise ConfigError(f"--losses {text!r}: a method is listed twice")
    return methods


def _flat(config: RunConfig) -> dict:
    """``{"section.key": value}``, sub-sections flattened too (``rollout.vllm.dtype``, ``model.lora.rank``);
    dict-valued options (``loss_options``) stay whole."""
    flat: dict = {}

    def walk(node, values: dict, prefix: str) -> None:
        for key, value in values.items():
            if dataclasses.is_dataclass(getattr(node, key)):
                walk(getattr(node, key), value, f"{prefix}{key}.")
            else:
                flat[prefix + key] = value

    walk(config, config.to_dict(), "")
    return flat


def _override(key: str, value) -> str:
    # JSON is YAML, so the config loader parses this back to the same value (lists for tuples).
    return f"{key}={json.dumps(list(value) if isinstance(value, tuple) else value)}"


def method_overrides(method: str) -> dict:
    """What a ``--losses`` entry changes: a preset's keys that differ from ``default``, or a loss name."""
    from tepo.losses import POLICY_LOSSES

    presets = set(list_presets())
    if method in presets and method != "default":
        preset, default = _flat(load_config(method)), _flat(load_config("default"))
        changes = {k: v for k, v in preset.items() if default.get(k) != v}
        # The loss's own options belong to the loss: always taken from the method, never from the base config.
        changes["algorithm.loss"] = preset["algorithm.loss"]
        changes["algorithm.loss_options"] = preset["algorithm.loss_options"]
        return changes
    if method in POLICY_LOSSES:
        return {"algorithm.loss": method, "algorithm.loss_options": {}}
    raise ConfigError(
        f"--losses: {method!r} is neither a registered loss ({', '.join(sorted(POLICY_LOSSES))}) "
        f"nor a preset ({', '.join(sorted(presets - {'default'}))})"
    )


def _digests(config: RunConfig) -> tuple[str, str]:
    """(prompt schedule + held-out digest, held-out-only digest) of one run's config."""
    from tepo.data import PromptStream
    from tepo.training.datasets import load_datasets

    train_problems, held_out = load_datasets(config)
    stream = PromptStream(train_problems, seed=config.train.seed)
    digest, held = hashlib.sha256(), hashlib.sha256()
    for _ in range(config.train.steps):
        for problem in stream.take(config.train.prompts_per_step):
            digest.update(f"{problem.problem}\x00{problem.answer}\x01".encode())
    for problem in held_out:
        item = f"H{problem.problem}\x00{problem.answer}\x01".encode()
        digest.update(item)
        held.update(item)
    return digest.hexdigest()[:16], held.hexdigest()[:16]


def plan_comparison(
    directory: Path,
    methods: Sequence[str],
    seeds: Sequence[int],
    *,
    config: str | None = None,
    overrides: Sequence[str] = (),
    check_prompts: bool = True,
    eval_seed: int | None = DEFAULT_EVAL_SEED,
) -> ComparisonPlan:
    """Resolve every run's config (validated now, before any training) and check the settings are identical.

    ``eval_seed``: the one held-out draw every run is scored on (``eval.seed``), unless an override sets it;
    None leaves ``eval.seed`` as the base config has it."""
    directory = Path(directory)
    base = config or "compare_default"
    overrides = list(overrides)
    if eval_seed is not None and not any(o.split("=", 1)[0].strip() == "eval.seed" for o in overrides):
        overrides.append(f"eval.seed={eval_seed}")
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if key in ("train.seed", "algorithm.loss"):
            raise ConfigError(f"override {item!r}: {key} is set by tepo compare (use --seeds / --losses)")
    plan = ComparisonPlan(directory, list(methods), list(seeds), base, overrides, [])
    base_flat = _flat(load_config(base, overrides))
    for method in methods:
        changes = method_overrides(method)
        plan.method_changes[method] = changes
        outside = {k: v for k, v in changes.items() if not k.startswith("algorithm.")}
        if outside:
            plan.notes.append(
                f"{method} also changes {', '.join(f'{k}={v!r}' for k, v in sorted(outside.items()))} "
                "(set by its preset): its rows differ from the others in more than the algorithm"
            )
        for seed in seeds:
            run_dir = directory / method / f"seed{seed}"
            items = (
                [_override(k, v) for k, v in changes.items()]
                + overrides
                + [
                    f"train.seed={seed}",
                    f"train.output_dir={json.dumps(str(directory / method))}",
                    f"train.run_name=seed{seed}",
                ]
            )
            try:
                run_config = load_config(base, items)
            except ConfigError as err:
                raise ConfigError(f"method {method!r}, seed {seed}: {err}") from None
            plan.runs.append(RunSpec(method, seed, run_dir, run_config))
    _check_identical(plan, base_flat)
    if check_prompts:
        for seed in seeds:
            specs = [r for r in plan.runs if r.seed == seed]
            plan.prompt_digests[str(seed)] = {}
            for spec in specs:
                plan.prompt_digests[str(seed)][spec.method], spec.held_out_digest = _digests(spec.config)
            if len(set(plan.prompt_digests[str(seed)].values())) > 1:
                plan.notes.append(
                    f"seed {seed}: the methods' prompt schedules differ ({plan.prompt_digests[str(seed)]}); "
                    "a preset changed the data or batch settings"
                )
    if any(r.config.algorithm.dynamic_sampling for r in plan.runs):
        plan.notes.append(
            "dynamic sampling is on for some runs: extra prompt batches are drawn when groups are dropped, so the "
            "prompt stream diverges between methods after the first refill (the digests cover the first draw of "
            "each step only)"
        )
    return plan


def _check_identical(plan: ComparisonPlan, base_flat: dict) -> None:
    """Every run equals the base outside the algorithm section and its own method's declared changes."""
    for run in plan.runs:
        flat = _flat(run.config)
        allowed = set(plan.method_changes[run.method]) | _PER_RUN_KEYS | {"data.source", "eval.source"}
        stray = {
            k
            for k, v in flat.items()
            if k not in allowed and base_flat.get(k) != v and not k.startswith("algorithm.")
        }
        if stray:  # pragma: no cover - only reachable if config loading itself changed keys behind our back
            raise ConfigError(f"{run.run_dir}: settings differ from the base config in {sorted(stray)}")


# --------------------------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------------------------


@dataclass
class RunOutcome:
    spec: RunSpec
    action: str  # "reused" | "resumed" | "restarted" | "trained"
    seconds: float


def run_state(run_dir: Path) -> str:
    """``finished`` (summary.json), ``interrupted`` (config.yaml, no summary) or ``new``."""
    run_dir = Path(run_dir)
    if (run_dir / "summary.json").exists():
        return "finished"
    if (run_dir / "config.yaml").exists():
        return "interrupted"
    return "new"


# Precision "auto" resolves when a run starts (tepo.precision) and the run directory keeps the value it resolved
# to: a planned "auto" matches whatever a started run recorded (the table shows each run's precision).
_PRECISION_KEYS = ("model.autocast_bf16", "rollout.autocast_bf16", "rollout.vllm.dtype")


def _config_differences(saved: RunConfig, planned: RunConfig) -> list[str]:
    a, b = _flat(saved), _flat(planned)
    # train.micro_batch_tokens "auto" is a function of rollout.max_new_tokens (tepo.training.micro_batches): compare
    # the layouts the two configs run with, so a planned auto matches a run saved with the None it resolves to.
    for flat in (a, b):
        flat["train.micro_batch_tokens"] = resolve_micro_batch_tokens(
            flat.get("train.micro_batch_tokens"), flat.get("rollout.max_new_tokens", 0)
        )
    # eval.pass_k_samples adds measures at the start and the end and changes nothing else (its own sampling seed): a
    # finished run without them is the same run, and the table shows pass@k for the runs that have it.
    ignore = {"log.progress", "eval.pass_k_samples"} | {k for k in _PRECISION_KEYS if b.get(k) == "auto"}
    return sorted(k for k in a.keys() | b.keys() if k not in ignore and a.get(k) != b.get(k))


def eval_sharing_key(config: RunConfig, held_out_digest: str | None = None) -> str:
    """Runs with equal keys score the initial policy identically: same model, held-out set and eval settings.

    Every config key counts except those that only affect training (``_NOT_EVAL_KEYS`` and the ``algorithm``,
    ``optim`` and ``log`` sections); an unknown new key therefore prevents sharing rather than allowing a wrong
    one. ``held_out_digest`` (the SHA-256 of the held-out problems) stands for the data keys that choose the
    held-out set; ``train.seed`` is dropped from the key only when it is known not to matter: a digest is given
    and the evaluation is greedy only (``eval.samples == 0``; the sampled pass is seeded by ``train.seed``).
    """
    flat = _flat(config)
    kept = {
        k: v for k, v in flat.items() if not k.startswith(_NOT_EVAL_KEYS_PREFIX) and k not in _NOT_EVAL_KEYS
    }
    if held_out_digest is not None:
        kept["held_out_digest"] = held_out_digest
        if not config.eval.samples:
            kept.pop("train.seed")
    return json.dumps(kept, sort_keys=True, default=str)


def _share_eval_before(plan: ComparisonPlan, spec: RunSpec) -> None:
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
    from tepo.training.trainer import run_device

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
            digest = _digests(saved)[1] if spec.held_out_digest is not None else None
            if eval_sharing_key(saved, digest) == key:
                return source
    return None


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
            raise ConfigError(
                f"{spec.run_dir} holds a run with different settings ({', '.join(diffs)}); "
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
        _share_eval_before(plan, spec)
        train_fn(spec.config, run_dir=spec.run_dir)
        return RunOutcome(spec, "restarted", time.perf_counter() - start)
    _share_eval_before(plan, spec)
    log(f"[compare] training {spec.method} seed {spec.seed} -> {spec.run_dir}")
    train_fn(spec.config, run_dir=spec.run_dir)
    return RunOutcome(spec, "trained", time.perf_counter() - start)


# Overrides that add measures and change no training step: plans that differ only in them share a directory's runs.
_MEASURE_ONLY_OVERRIDES = ("eval.pass_k_samples=",)


def _training_overrides(record: dict) -> tuple:
    kept = [o for o in record.get("overrides", []) if not o.startswith(_MEASURE_ONLY_OVERRIDES)]
    return record.get("base_config"), tuple(kept)


def merge_plans(earlier: dict, new: dict) -> dict:
    """The plan a directory records after ``new`` ran where ``earlier`` had: the union of their runs when both
    train with the same settings (base config and overrides, measure-only ones aside), so a study grows by
    methods and seeds (``--seeds 3,4,5`` beside seeds 0-2) and its table keeps every run; otherwise ``new``
    alone, with a note that it replaced a plan of other settings (whose runs then leave the table)."""
    if _training_overrides(earlier) != _training_overrides(new):
        note = f"replaced an earlier plan with other settings: {earlier.get('base_config')} {earlier.get('overrides')}"
        return new | {"notes": [*new["notes"], note]}
    runs = {m: dict(seeds) for m, seeds in earlier.get("runs", {}).items()}
    for method, seeds in new["runs"].items():
        runs.setdefault(method, {}).update(seeds)
    digests = {seed: dict(by_method) for seed, by_method in earlier.get("prompt_digests", {}).items()}
    for seed, by_method in new["prompt_digests"].items():
        digests.setdefault(seed, {}).update(by_method)
    history = list(earlier.get("earlier_plans", []))
    if (earlier.get("overrides"), earlier.get("methods"), earlier.get("seeds")) != (
        new["overrides"],
        new["methods"],
        new["seeds"],
    ):
        history.append({k: earlier.get(k) for k in ("base_config", "overrides", "methods", "seeds")})
    return new | {
        "methods": list(dict.fromkeys([*earlier.get("methods", []), *new["methods"]])),
        "seeds": sorted({*map(int, earlier.get("seeds", [])), *new["seeds"]}),
        "runs": runs,
        "method_changes": earlier.get("method_changes", {}) | new["method_changes"],
        "prompt_digests": digests,
        "notes": list(dict.fromkeys([*earlier.get("notes", []), *new["notes"]])),
        **({"earlier_plans": history} if history else {}),
    }


def write_plan(plan: ComparisonPlan) -> Path:
    """Record ``plan`` in its directory, merged with the plan already there (:func:`merge_plans`)."""
    plan.directory.mkdir(parents=True, exist_ok=True)
    record = plan.to_dict()
    earlier = load_plan(plan.directory)
    if earlier is not None:
        record = merge_plans(earlier, record)
    path = plan.directory / PLAN_FILE
    atomic_write_text(path, json.dumps(record, indent=2, default=str))
    return path


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


def load_plan(directory: Path) -> dict | None:
    path = Path(directory) / PLAN_FILE
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path}: invalid JSON ({err.msg}); delete it to re-plan") from None


def discover_runs(directory: Path) -> dict[str, dict[int, Path]]:
    """``{method: {seed: run_dir}}`` of a comparison directory (from its plan, else from ``*/seed*/`` folders)."""
    directory = Path(directory)
    plan = load_plan(directory)
    runs: dict[str, dict[int, Path]] = {}
    if plan is not None:  # its runs (a merged plan's need not be every method x every seed)
        planned = plan.get("runs") or {m: {s: f"{m}/seed{s}" for s in plan["seeds"]} for m in plan["methods"]}
        for method in plan["methods"]:
            for seed, path in sorted(planned.get(method, {}).items(), key=lambda item: int(item[0])):
                runs.setdefault(method, {})[int(seed)] = directory / path
        return runs
    for config in sorted(directory.glob("*/seed*/config.yaml")):
        run_dir = config.parent
        suffix = run_dir.name[len("seed") :]
        if suffix.isdigit():
            runs.setdefault(run_dir.parent.name, {})[int(suffix)] = run_dir
    return runs
