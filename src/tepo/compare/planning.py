"""Plan a comparison: every method x seed under identical settings, each run's config resolved and validated before
any training, and the fairness checks recorded.

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
- Every run is scored on one held-out draw: ``plan_comparison`` sets ``eval.seed`` (``--eval-seed``, default
  :data:`DEFAULT_EVAL_SEED`) for all of them, and each evaluation writes its per-problem records
  (``tepo.evaluate.records``), which the table pairs problem by problem (``tepo.compare.problems``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tepo.config import ConfigError, RunConfig, list_presets, load_config

# The held-out draw shared by every run of a comparison (eval.seed): paired differences are then measured on the
# same problems, whatever the training seed.
DEFAULT_EVAL_SEED = 0

# Sections/keys that may differ between the runs of one comparison without making them unfair.
_PER_RUN_KEYS = {"train.seed", "train.run_name", "train.output_dir"}


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


def flat_config(config: RunConfig) -> dict:
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
        preset, default = flat_config(load_config(method)), flat_config(load_config("default"))
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


def config_digests(config: RunConfig) -> tuple[str, str]:
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
    base_flat = flat_config(load_config(base, overrides))
    # The command line's overrides come after a preset's changes, so a key they set is the same for every method.
    overridden = {item.split("=", 1)[0].strip() for item in overrides}
    for method in methods:
        changes = method_overrides(method)
        plan.method_changes[method] = changes
        outside = {k: v for k, v in changes.items() if not k.startswith("algorithm.") and k not in overridden}
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
                plan.prompt_digests[str(seed)][spec.method], spec.held_out_digest = config_digests(
                    spec.config
                )
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
        flat = flat_config(run.config)
        allowed = set(plan.method_changes[run.method]) | _PER_RUN_KEYS | {"data.source", "eval.source"}
        stray = {
            k
            for k, v in flat.items()
            if k not in allowed and base_flat.get(k) != v and not k.startswith("algorithm.")
        }
        if stray:  # pragma: no cover - only reachable if config loading itself changed keys behind our back
            raise ConfigError(f"{run.run_dir}: settings differ from the base config in {sorted(stray)}")
