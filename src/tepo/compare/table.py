"""The comparison table: one row per method, one column per benchmark plus their average, mean over seeds with a
95% bootstrap interval, steps (and wall time) to a reward threshold, the best of each column marked.

Columns, from each run directory:

- ``held-out``: greedy accuracy of the final policy on the run's held-out set (``summary.json`` ``after``),
- one column per benchmark evaluated with ``tepo eval --output-dir <run_dir>/eval/...`` (its ``results.json``
  ``benchmarks.<name>.accuracy``; see :func:`benchmark_scores`),
- ``avg``: per seed, the mean of that seed's benchmark columns (held-out included), then the interval over seeds;
  shown only when there are at least two benchmark columns,
- ``sampled``: held-out accuracy of one sample at ``eval.temperature``,
- ``cons@n``: held-out majority vote over the ``eval.samples`` answers of each problem (``eval_sampled_cons``;
  `tepo.passk.cons_at_k`), a column only when some run logged it (``eval.samples >= 2``),
- ``reward``: mean batch reward over the last third of the steps,
- ``steps@R`` / ``wall s@R``: the first step at which the trailing ``window``-step mean of the batch reward reaches
  the threshold ``R``, and the summed ``step_seconds`` up to it; averaged over the seeds that reached it, and the
  count is shown (``2/3``) when some did not,
- ``steps@90% <ref>`` / ``wall s@90% <ref>``: convergence as TEPO and DAPO report it (:func:`convergence`): the
  first step at which the run's held-out accuracy curve reaches ``share`` (default 0.9) of the *reference*
  method's final held-out accuracy, and the summed ``step_seconds`` of the steps up to it (training time; the
  evaluations themselves are not in ``step_seconds``). A run that never reaches it counts as "not reached";
  the cell averages the seeds that reached it and shows how many did,
- ``held-out AUC``: the area under the held-out accuracy curve over steps, divided by the number of steps: the
  mean held-out accuracy over training (:func:`curve_auc`).
- ``held-out max drop``: the largest fall of the held-out accuracy curve below its best earlier point
  (:func:`max_drop`): 0 for a curve that never goes down; "model degradation" in TEPO's words,
- ``entropy kept``: the mean token entropy of the last third of the steps divided by that of step 1
  (:func:`entropy_kept`): near 1 when entropy holds, near 0 when it collapses. Step 1 scores the initial
  policy's samples, so at one seed its entropy is the same for every method with one update per rollout.
  These two describe the papers' "steadier training" and "entropy collapse"; neither is marked best, since
  less entropy or a flat curve is not better by itself,
- ``Δ held-out vs <ref>``: per seed, the method's final held-out accuracy minus the reference method's on the
  same seed (the same prompts, sampling seeds and held-out set), then the interval over seeds: the paired
  difference, which is what "no worse than" questions need (two overlapping intervals of the accuracies
  themselves do not answer them); empty on the reference's own row,
- ``s/step``: the run's median ``step_seconds`` (training steps only, evaluations excluded).

The held-out accuracy curve of a run (:func:`held_out_curve`) is greedy accuracy at step 0 (``eval_before.json``,
else ``summary.json`` ``before``), at every metrics row that carries ``eval_greedy_accuracy`` (every
``eval.every`` steps) and at the last step (``summary.json`` ``after``). The convergence target is one number
for the whole table: ``share`` times the reference method's *seed-mean* final held-out accuracy (not each
seed's own reference run), so every method and seed is measured against the same bar and a lucky or unlucky
reference seed does not move the bar of one seed only; the intervals then describe the method's own
run-to-run variation. The reference is ``grpo`` when it is among the methods, else the first method.

The Markdown table is followed by per-seed tables of the final held-out and sampled accuracies
(:func:`per_seed_rows`; ``rows[i].per_seed`` in the JSON).

Every value is the mean over seeds with the percentile bootstrap interval of ``tepo.compare.stats``. Higher is
better for accuracies and reward, lower for steps and wall time; ``best`` marks the best mean of each column
(ties all marked). An ``initial policy`` row gives the held-out accuracies before training.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import NamedTuple

from tepo.compare.runner import run_state
from tepo.compare.stats import (
    DEFAULT_BOOTSTRAP_SEED,
    DEFAULT_CONFIDENCE,
    DEFAULT_RESAMPLES,
    bootstrap_interval,
)
from tepo.files import atomic_write_text
from tepo.metrics import read_metrics

INITIAL_ROW = "initial policy"
DEFAULT_CONVERGENCE_SHARE = 0.9
DEFAULT_REFERENCE = "grpo"
EVAL_BEFORE_FILE = (
    "eval_before.json"  # tepo.training.EVAL_BEFORE, named here so tables never import the trainer
)
REACH_KEYS = ("steps_to_threshold", "seconds_to_threshold", "steps_to_share", "seconds_to_share")
_BENCH_KEYS = ("accuracy", "greedy_accuracy", "mean_accuracy")


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    higher_is_better: bool = True
    benchmark: bool = False  # part of the average
    ranked: bool = True  # its best mean is marked (False for differences and for descriptive columns)


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _accuracy(node) -> float | None:
    if not isinstance(node, dict):
        return None
    return next((_number(node[k]) for k in _BENCH_KEYS if _number(node.get(k)) is not None), None)


def benchmark_scores(run_dir: Path) -> dict[str, float]:
    """``{benchmark: accuracy}`` from ``tepo eval`` output under ``<run_dir>/eval/`` (any depth), where present.

    A ``results.json`` of ``tepo eval`` holds ``{"benchmarks": {name: {"accuracy": ...}}}``; a file without that
    mapping counts as one benchmark named after its folder, with ``accuracy`` at its top level or under
    ``metrics`` / ``summary``. Later files (by path order) win for a repeated name.
    """
    scores = {}
    for path in sorted(Path(run_dir).glob("eval/**/results.json")):
        data = _read_json(path) or {}
        if isinstance(data.get("benchmarks"), dict):
            for name, metrics in data["benchmarks"].items():
                if (acc := _accuracy(metrics)) is not None:
                    scores[str(name)] = acc
            continue
        for node in (data, data.get("metrics"), data.get("summary")):
            if (acc := _accuracy(node)) is not None:
                scores[path.parent.name] = acc
                break
    return scores


def steps_to_threshold(
    rows: list[dict], threshold: float, window: int = 3
) -> tuple[int | None, float | None]:
    """First step whose trailing ``window``-step mean reward is >= ``threshold``, and the seconds spent until then.

    The trailing mean at step ``s`` averages the rewards of the last ``min(window, s)`` logged steps, so a single
    lucky batch does not count as reaching the threshold. Returns ``(None, None)`` when it is never reached.
    """
    if window < 1:
        raise ValueError(f"steps_to_threshold: window must be >= 1, got {window}")
    recent: list[float] = []
    seconds = 0.0
    for row in rows:
        seconds += _number(row.get("step_seconds")) or 0.0
        reward = _number(row.get("reward_mean"))
        if reward is None:
            continue
        recent = [*recent, reward][-window:]
        if sum(recent) / len(recent) >= threshold:
            return int(row["step"]), seconds
    return None, None


def held_out_curve(
    run_dir: Path, key: str = "eval_greedy_accuracy", rows: list[dict] | None = None
) -> list[tuple[int, float]]:
    """``[(step, held-out accuracy)]``: step 0 (initial policy), every eval row, the final accuracy.

    ``key`` picks the accuracy: ``eval_greedy_accuracy`` (the convergence columns' curve) or
    ``eval_sampled_accuracy`` (one sample per problem at ``eval.temperature``).

    Step 0 is ``eval_before.json`` (else ``summary.json`` ``before``); the final point is ``summary.json``
    ``after`` at the last logged step (``summary.json`` ``steps`` when there is no metrics row). Points without
    a finite accuracy are left out; a step logged twice keeps its last value. ``rows``: the run's metrics rows
    when the caller has read them already (else ``metrics.jsonl`` is read here).
    """
    run_dir = Path(run_dir)
    summary = _read_json(run_dir / "summary.json") or {}
    before = _read_json(run_dir / EVAL_BEFORE_FILE) or summary.get("before") or {}
    if rows is None:
        rows = read_metrics(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []
    points: dict[int, float] = {}
    if (acc := _number(before.get(key))) is not None:
        points[0] = acc
    last_step = 0
    for row in rows:
        step = row.get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            last_step = max(last_step, step)
            if (acc := _number(row.get(key))) is not None:
                points[step] = acc
    if not rows and isinstance(summary.get("steps"), int):
        last_step = summary["steps"]
    final = _number((summary.get("after") or {}).get(key))
    if final is not None and last_step > 0:
        points[last_step] = final
    return sorted(points.items())


def convergence(
    curve: list[tuple[int, float]], rows: list[dict], target: float
) -> tuple[int | None, float | None]:
    """First step whose held-out accuracy is >= ``target``, and the summed ``step_seconds`` of steps 1..that step.

    Returns ``(None, None)`` when no point of the curve reaches the target ("not reached"); step 0 (the initial
    policy already at the target) takes 0 seconds.
    """
    step = next((s for s, acc in curve if acc >= target), None)
    if step is None:
        return None, None
    seconds = sum(
        _number(r.get("step_seconds")) or 0.0
        for r in rows
        if isinstance(r.get("step"), int) and 0 < r["step"] <= step
    )
    return step, seconds


def curve_auc(curve: list[tuple[int, float]]) -> float | None:
    """Trapezoid area under ``curve`` divided by its step span: the mean held-out accuracy over training.

    ``sum((s[i+1] - s[i]) * (a[i] + a[i+1]) / 2) / (s[-1] - s[0])``; with the curve starting at step 0 the
    divisor is the number of steps. ``None`` with fewer than two points.
    """
    if len(curve) < 2 or curve[-1][0] <= curve[0][0]:
        return None
    area = sum((s1 - s0) * (a0 + a1) / 2 for (s0, a0), (s1, a1) in pairwise(curve))
    return area / (curve[-1][0] - curve[0][0])


def max_drop(curve: list[tuple[int, float]]) -> float | None:
    """Largest fall of ``curve`` below its best earlier point: ``max_i (max_{j<=i} a_j - a_i)``; ``None`` if empty.

    0 for a curve that never decreases; a curve 0.2, 0.6, 0.4, 0.5 has drop 0.6 - 0.4 = 0.2.
    """
    if not curve:
        return None
    best, drop = -math.inf, 0.0
    for _, accuracy in curve:
        best = max(best, accuracy)
        drop = max(drop, best - accuracy)
    return drop


def entropy_kept(rows: list[dict]) -> float | None:
    """Mean ``entropy_mean`` of the last third of the logged steps divided by the first logged step's.

    The last third is ``max(1, n // 3)`` rows, as ``summary.json`` ``reward_last_third`` counts them. ``None``
    without entropy rows or with a first entropy of 0 (nothing to keep).
    """
    entropies = [float(r["entropy_mean"]) for r in rows if _number(r.get("entropy_mean")) is not None]
    if not entropies or entropies[0] <= 0:
        return None
    last = entropies[-max(1, len(entropies) // 3) :]
    return sum(last) / len(last) / entropies[0]


def run_precision(run_dir: Path) -> str:
    """The precision a run trained at, in one word: ``bf16`` (autocast of the update) or ``float32``.

    Runs since 2026-12-05 record it in ``summary.json`` (``precision``, tepo.precision); older runs have the value
    in ``config.yaml`` (``model.autocast_bf16``, then always explicit: true by default).
    """
    run_dir = Path(run_dir)
    recorded = (_read_json(run_dir / "summary.json") or {}).get("precision")
    if isinstance(recorded, dict) and "model_autocast_bf16" in recorded:
        return "bf16" if recorded["model_autocast_bf16"] else "float32"
    try:
        import yaml

        saved = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, ValueError):
        return "unknown"
    value = (saved.get("model") or {}).get("autocast_bf16", True)
    return {True: "bf16", False: "float32"}.get(value, str(value))


class RunValues(NamedTuple):
    """One finished run as the table reads it: column values after and before training, and the raw series
    (held-out curve, metrics rows) that the convergence columns need once the reference's final is known."""

    after: dict[str, float]
    before: dict[str, float]
    curve: list[tuple[int, float]]
    rows: list[dict]


def run_values(run_dir: Path, *, threshold: float, window: int) -> RunValues:
    """One run's values by column key (missing values left out), with the curve and rows they came from."""
    run_dir = Path(run_dir)
    summary = _read_json(run_dir / "summary.json") or {}
    # The initial policy's scores as the held-out curve reads them: eval_before.json, the file the trainer
    # scored (or, shared by tepo compare, read back), else the summary's copy.
    before = _read_json(run_dir / EVAL_BEFORE_FILE) or summary.get("before") or {}
    after = summary.get("after") or {}
    rows = read_metrics(run_dir / "metrics.jsonl")
    values: dict[str, float | None] = {
        "held_out": _number(after.get("eval_greedy_accuracy")),
        "sampled": _number(after.get("eval_sampled_accuracy")),
        "sampled_cons": _number(after.get("eval_sampled_cons")),
        "reward": _number(summary.get("reward_last_third")),
    }
    for name, score in benchmark_scores(run_dir).items():
        values[f"bench:{name}"] = score
    steps, seconds = steps_to_threshold(rows, threshold, window)
    values["steps_to_threshold"] = None if steps is None else float(steps)
    values["seconds_to_threshold"] = seconds
    curve = held_out_curve(run_dir, rows=rows)
    values["auc_held_out"] = curve_auc(curve)
    values["held_out_drop"] = max_drop(curve)
    values["entropy_kept"] = entropy_kept(rows)
    step_seconds = [float(r["step_seconds"]) for r in rows if _number(r.get("step_seconds")) is not None]
    if step_seconds:
        values["seconds_per_step"] = statistics.median(step_seconds)
    initial = {
        "held_out": _number(before.get("eval_greedy_accuracy")),
        "sampled": _number(before.get("eval_sampled_accuracy")),
        "sampled_cons": _number(before.get("eval_sampled_cons")),
    }
    return RunValues(
        after={k: v for k, v in values.items() if v is not None},
        before={k: v for k, v in initial.items() if v is not None},
        curve=curve,
        rows=rows,
    )


def build_table(
    runs: dict[str, dict[int, Path]],
    *,
    threshold: float = 0.5,
    window: int = 3,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    bootstrap_seed: int = DEFAULT_BOOTSTRAP_SEED,
    convergence_share: float = DEFAULT_CONVERGENCE_SHARE,
    reference: str | None = None,
) -> dict:
    """The table as a JSON-ready dict (see the module docstring); only finished runs (``summary.json``) count."""
    if not 0 < convergence_share <= 1:
        raise ValueError(f"--convergence-share: expected a share in (0, 1], got {convergence_share}")
    if reference is not None and reference not in runs:
        raise ValueError(f"--reference {reference!r}: not one of the methods ({', '.join(runs)})")
    if reference is None and runs:
        reference = DEFAULT_REFERENCE if DEFAULT_REFERENCE in runs else next(iter(runs))
    per_method: dict[str, dict[int, dict]] = {}
    series: dict[tuple[str, int], RunValues] = {}  # read once; the convergence loop below reuses them
    initial: dict[int, dict] = {}
    precision: dict[tuple[str, int], str] = {}  # each finished run's precision (run_precision)
    missing = []
    for method, seeds in runs.items():
        for seed, run_dir in sorted(seeds.items()):
            if run_state(run_dir) != "finished":
                missing.append(f"{method}/seed{seed}")
                continue
            read = series[method, seed] = run_values(run_dir, threshold=threshold, window=window)
            per_method.setdefault(method, {})[seed] = read.after
            precision[method, seed] = run_precision(run_dir)
            # identical across methods for one seed: the same initial policy
            initial.setdefault(seed, read.before)

    ref_finals = [v["held_out"] for v in per_method.get(reference, {}).values() if "held_out" in v]
    ref_final = sum(ref_finals) / len(ref_finals) if ref_finals else None
    target = None if ref_final is None else convergence_share * ref_final
    if target is not None:
        for method, seeds in per_method.items():
            for seed, values in seeds.items():
                step, secs = convergence(series[method, seed].curve, series[method, seed].rows, target)
                if step is not None:
                    values["steps_to_share"], values["seconds_to_share"] = float(step), secs

    reference_by_seed = per_method.get(reference, {})
    unpaired = []  # (method, seed) whose run and the reference's ran at different precisions: not differenced
    for method, seeds in per_method.items():
        if method == reference:
            continue
        for seed, values in seeds.items():
            ref = reference_by_seed.get(seed, {})
            if "held_out" in values and "held_out" in ref:
                if precision[method, seed] != precision[reference, seed]:
                    unpaired.append(
                        f"{method}/seed{seed} ({precision[method, seed]}) vs {reference} ({precision[reference, seed]})"
                    )
                    continue
                values["held_out_delta"] = values["held_out"] - ref["held_out"]

    benches = sorted(
        {k for seeds in per_method.values() for v in seeds.values() for k in v if k.startswith("bench:")}
    )
    columns = [Column("held_out", "held-out", True, True)]
    columns += [Column(b, b.split(":", 1)[1], True, True) for b in benches]
    if len(columns) >= 2:
        columns.append(Column("avg", "avg", True, False))
    r_label = f"{threshold:g}"
    all_values = [v for seeds in per_method.values() for v in seeds.values()]
    columns += [
        Column("sampled", "sampled"),
        *([Column("sampled_cons", "cons@n")] if any("sampled_cons" in v for v in all_values) else []),
        Column("reward", "reward (last 1/3)"),
        Column("steps_to_threshold", f"steps@{r_label}", higher_is_better=False),
        Column("seconds_to_threshold", f"wall s@{r_label}", higher_is_better=False),
        Column("steps_to_share", f"steps@{convergence_share:.0%} {reference}", higher_is_better=False),
        Column("seconds_to_share", f"wall s@{convergence_share:.0%} {reference}", higher_is_better=False),
        Column("auc_held_out", "held-out AUC"),
        Column("held_out_drop", "held-out max drop", higher_is_better=False, ranked=False),
        Column("entropy_kept", "entropy kept", ranked=False),
        Column("held_out_delta", f"Δ held-out vs {reference} (paired)", ranked=False),
        Column("seconds_per_step", "s/step", higher_is_better=False),
    ]
    bench_keys = [c.key for c in columns if c.benchmark]

    def cell(values: list[float], total: int) -> dict | None:
        if not values:
            return {"mean": None, "low": None, "high": None, "n": 0, "values": [], "of": total}
        out = bootstrap_interval(
            values, resamples=resamples, confidence=confidence, seed=bootstrap_seed
        ).to_dict()
        out["of"] = total
        return out

    rows = []
    for method, seeds in per_method.items():
        for values in seeds.values():
            if len(bench_keys) >= 2 and all(k in values for k in bench_keys):
                values["avg"] = sum(values[k] for k in bench_keys) / len(bench_keys)
        cells = {c.key: cell([v[c.key] for v in seeds.values() if c.key in v], len(seeds)) for c in columns}
        if method == reference:  # no difference with itself: an empty cell, not a missing one
            cells["held_out_delta"] = cell([], 0)
        per_seed = {str(seed): dict(values) for seed, values in sorted(seeds.items())}
        labels = sorted({precision[method, seed] for seed in seeds})
        rows.append(
            {
                "method": method,
                "seeds": sorted(seeds),
                "cells": cells,
                "per_seed": per_seed,
                "precision": labels,
            }
        )
    for column in columns:
        if not column.ranked:
            for row in rows:
                row["cells"][column.key]["best"] = False
            continue
        means = [r["cells"][column.key]["mean"] for r in rows]
        shares = [r["cells"][column.key]["n"] / max(r["cells"][column.key]["of"], 1) for r in rows]
        # Steps/wall time: compare only methods whose share of seeds reaching the threshold is the largest.
        eligible = [
            m is not None and (column.higher_is_better or s == max(shares)) for m, s in zip(means, shares)
        ]
        candidates = [m for m, ok in zip(means, eligible) if ok]
        best = (max if column.higher_is_better else min)(candidates) if candidates else None
        for row, mean, ok in zip(rows, means, eligible):
            row["cells"][column.key]["best"] = bool(
                len(rows) > 1
                and ok
                and best is not None
                and math.isclose(mean, best, rel_tol=1e-12, abs_tol=1e-12)
            )
    initial_cells = {}
    for key in ("held_out", "sampled", "sampled_cons"):
        vals = [v[key] for v in initial.values() if key in v]
        if vals:
            initial_cells[key] = cell(vals, len(initial)) | {"best": False}
    return {
        "columns": [
            {"key": c.key, "label": c.label, "higher_is_better": c.higher_is_better, "benchmark": c.benchmark}
            for c in columns
        ],
        "rows": rows,
        "initial": {
            "method": INITIAL_ROW,
            "seeds": sorted(initial),
            "cells": initial_cells,
            "per_seed": {str(seed): dict(values) for seed, values in sorted(initial.items())},
        }
        if initial_cells
        else None,
        "missing_runs": missing,
        # Runs of different precision share the table only with a column that says so, and are never paired.
        "precision": {"mixed": len(set(precision.values())) > 1, "unpaired": unpaired},
        "threshold": {"metric": "reward_mean", "value": threshold, "window": window},
        "convergence": {
            "metric": "eval_greedy_accuracy",
            "reference": reference,
            "share": convergence_share,
            "reference_final_mean": ref_final,
            "reference_seeds": len(ref_finals),
            "target": target,
        },
        "bootstrap": {
            "method": "percentile",
            "resamples": resamples,
            "confidence": confidence,
            "seed": bootstrap_seed,
            "unit": "seed",
        },
    }


# --------------------------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------------------------


def format_value(value: float | None, key: str) -> str:
    """A column's number as the tables show it: steps with one decimal, seconds whole, scores with three."""
    if value is None:
        return "-"
    if key in ("steps_to_threshold", "steps_to_share"):
        return f"{value:.1f}"
    if key in ("seconds_to_threshold", "seconds_to_share"):
        return f"{value:.0f}"
    if key == "seconds_per_step":
        return f"{value:.1f}"
    if key == "held_out_delta":
        return f"{round(value, 3) + 0.0:+.3f}"  # + 0.0: no "-0.000" for a difference that rounds to zero
    return f"{value:.3f}"


def format_cell(cell: dict | None, key: str, *, markdown: bool, with_interval: bool = True) -> str:
    if not cell or cell.get("mean") is None:
        if not cell or not cell.get("of"):
            return "-"
        return f"not reached (0/{cell['of']})" if key in REACH_KEYS else f"- (0/{cell['of']})"
    mean = format_value(cell["mean"], key)
    if cell.get("best"):
        mean = f"**{mean}**" if markdown else f"{mean}*"
    text = mean
    if with_interval and cell["n"] > 1:
        text += f" [{format_value(cell['low'], key)}, {format_value(cell['high'], key)}]"
    if cell.get("of") and cell["n"] < cell["of"]:
        text += f" ({cell['n']}/{cell['of']})"
    return text


def table_rows(table: dict, *, markdown: bool) -> tuple[list[str], list[list[str]]]:
    keys = [c["key"] for c in table["columns"]]
    mixed = (table.get("precision") or {}).get("mixed", False)
    headers = ["method", "seeds", *(["precision"] if mixed else [])] + [c["label"] for c in table["columns"]]
    body = []
    if table.get("initial"):
        init = table["initial"]
        body.append(
            [init["method"], str(len(init["seeds"])), *(["-"] if mixed else [])]
            + [format_cell(init["cells"].get(k), k, markdown=markdown) for k in keys]
        )
    for row in table["rows"]:
        body.append(
            [row["method"], str(len(row["seeds"])), *(["/".join(row.get("precision", []))] if mixed else [])]
            + [format_cell(row["cells"][k], k, markdown=markdown) for k in keys]
        )
    return headers, body


def table_footer(table: dict) -> str:
    b, t = table["bootstrap"], table["threshold"]
    lines = [
        f"mean over seeds [{b['confidence']:.0%} percentile bootstrap interval over seeds, {b['resamples']} resamples, "
        f"seed {b['seed']}]; best of each column marked; steps@{t['value']:g}: first step whose trailing "
        f"{t['window']}-step mean batch reward >= {t['value']:g} (seeds that reached it / all); entropy kept: mean "
        "token entropy of the last third of the steps / step 1's (descriptive, not ranked)",
    ]
    c = table.get("convergence") or {}
    if c.get("target") is not None:
        lines.append(
            f"steps@{c['share']:.0%} {c['reference']}: first step whose held-out greedy accuracy (step 0, every "
            f"eval, final) >= {c['share']:g} x {c['reference']}'s seed-mean final {c['reference_final_mean']:.3f} "
            f"= {c['target']:.3f}; wall s: summed step_seconds to it; held-out AUC: trapezoid area under that "
            "curve / steps (mean accuracy over training); held-out max drop: largest fall of that curve below an "
            "earlier best"
        )
    elif c.get("reference"):
        lines.append(f"steps@{c['share']:.0%}: no finished {c['reference']} run, so no convergence target")
    if table.get("missing_runs"):
        lines.append(f"not finished (left out): {', '.join(table['missing_runs'])}")
    precision = table.get("precision") or {}
    if precision.get("mixed"):
        lines.append(
            "precision: these runs did not all train at one precision (column 'precision'); their numbers are "
            "not comparable as equals"
        )
    if precision.get("unpaired"):
        lines.append(
            f"not paired (different precision, no paired difference): {', '.join(precision['unpaired'])}"
        )
    return "\n".join(lines)


PER_SEED_KEYS = ("held_out", "sampled")


def per_seed_rows(table: dict, key: str) -> tuple[list[str], list[list[str]]]:
    """Seeds as rows, methods as columns: one column's per-seed values (the initial policy first), so a reader
    sees which seeds moved a mean; a method's value on a seed it did not finish is ``-``."""
    methods = [r["method"] for r in table["rows"]]
    seeds = sorted({int(s) for r in table["rows"] for s in r.get("per_seed", {})})
    initial = table.get("initial") or {}
    initial_by_seed = initial.get("per_seed", {})
    headers = ["seed", INITIAL_ROW, *methods]
    body = []
    for seed in seeds:
        line = [str(seed), format_value(initial_by_seed.get(str(seed), {}).get(key), key)]
        for row in table["rows"]:
            line.append(format_value(row.get("per_seed", {}).get(str(seed), {}).get(key), key))
        body.append(line)
    return headers, body


def render_markdown(table: dict) -> str:
    from tepo.metrics.tables import format_table

    headers, body = table_rows(table, markdown=True)
    text = format_table(headers, body) + "\n\n" + table_footer(table) + "\n"
    labels = {c["key"]: c["label"] for c in table["columns"]}
    for key in (k for k in PER_SEED_KEYS if k in labels):
        seed_headers, seed_body = per_seed_rows(table, key)
        if seed_body and any(cell != "-" for line in seed_body for cell in line[2:]):
            text += f"\nPer seed: {labels[key]}\n\n" + format_table(seed_headers, seed_body) + "\n"
    return text


def select_columns(table: dict, keys: list[str]) -> dict:
    """A copy of ``table`` with only the columns named in ``keys`` (column keys such as ``held_out`` or
    ``steps_to_share``), in that order: a narrower table for a terminal or a page. Raises ``ValueError``
    naming the available keys for an unknown one."""
    by_key = {c["key"]: c for c in table["columns"]}
    unknown = [k for k in keys if k not in by_key]
    if unknown:
        raise ValueError(
            f"--columns: unknown column {', '.join(map(repr, unknown))}; this table has {', '.join(by_key)}"
        )
    return {**table, "columns": [by_key[k] for k in keys]}


def render_terminal(table: dict) -> str:
    from tepo.metrics.tables import format_table

    headers, body = table_rows(table, markdown=False)
    return format_table(headers, body) + "\n" + table_footer(table)


def write_table(table: dict, directory: Path) -> tuple[Path, Path]:
    directory = Path(directory)
    md, js = directory / "table.md", directory / "table.json"
    atomic_write_text(md, render_markdown(table))  # a killed `tepo compare` leaves the old table, never half
    atomic_write_text(js, json.dumps(table, indent=2))
    return md, js
