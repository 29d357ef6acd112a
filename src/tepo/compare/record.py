"""A comparison directory on disk: its plan (``comparison.json``), merged across invocations, and its runs.

Layout::

    <comparison_dir>/comparison.json        the plan: methods, seeds, base config, overrides, fairness checks
    <comparison_dir>/<method>/seed<k>/      one ordinary run directory per method and seed
    <comparison_dir>/table.md, table.json   the comparison table (``tepo.compare.table``)
"""

from __future__ import annotations

import json
from pathlib import Path

from tepo.config import ConfigError
from tepo.files import atomic_write_text

PLAN_FILE = "comparison.json"


def run_state(run_dir: Path) -> str:
    """``finished`` (summary.json), ``interrupted`` (config.yaml, no summary) or ``new``."""
    run_dir = Path(run_dir)
    if (run_dir / "summary.json").exists():
        return "finished"
    if (run_dir / "config.yaml").exists():
        return "interrupted"
    return "new"


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


def write_plan(plan) -> Path:
    """Record ``plan`` in its directory, merged with the plan already there (:func:`merge_plans`)."""
    plan.directory.mkdir(parents=True, exist_ok=True)
    record = plan.to_dict()
    earlier = load_plan(plan.directory)
    if earlier is not None:
        record = merge_plans(earlier, record)
    path = plan.directory / PLAN_FILE
    atomic_write_text(path, json.dumps(record, indent=2, default=str))
    return path


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
