"""The comparison table: one row per method, one column per benchmark plus their average, mean over seeds with a
95% Student-t interval, steps (and wall time) to a reward threshold, the best of each column marked, and the
paired tests against the reference method.

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
  the threshold ``R``, and the summed ``time/step_seconds`` up to it; averaged over the seeds that reached it, and the
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
- ``grad norm``: the run's mean pre-clip gradient norm over its steps (:func:`grad_norm_mean`), what TEPO v1
  Fig. 3 compares; descriptive, not ranked,
- ``grad norm cv``: its coefficient of variation over the steps (sd / mean, :func:`grad_norm_cv`): how steady the
  norm is; descriptive, not ranked,
- ``Δ held-out vs <ref>``: per seed, the method's final held-out accuracy minus the reference method's on the
  same seed (the same prompts, sampling seeds and held-out set), then the interval over seeds: the paired
  difference, which is what "no worse than" questions need (two overlapping intervals of the accuracies
  themselves do not answer them); empty on the reference's own row,
- ``s/step``: the run's median ``time/step_seconds`` (training steps only, evaluations excluded).

Metric names are the grouped ones of :mod:`tepo.metrics.names` (``reward/mean``, ``time/step_seconds``); runs
logged before the grouping (flat ``reward_mean``, ``step_seconds``) read the same through ``read_metrics``. What
one run's files say is computed in :mod:`tepo.compare.measures`, the text of the table in
:mod:`tepo.compare.render`.

The held-out accuracy curve of a run (:func:`held_out_curve`) is greedy accuracy at step 0 (``eval_before.json``,
else ``summary.json`` ``before``), at every metrics row that carries ``eval/greedy_accuracy`` (every
``eval.every`` steps) and at the last step (``summary.json`` ``after``). The convergence target is one number
for the whole table: ``share`` times the reference method's *seed-mean* final held-out accuracy (not each
seed's own reference run), so every method and seed is measured against the same bar and a lucky or unlucky
reference seed does not move the bar of one seed only; the intervals then describe the method's own
run-to-run variation. The reference is ``grpo`` when it is among the methods, else the first method.

The Markdown table is followed by per-seed tables of the final held-out and sampled accuracies
(:func:`per_seed_rows`; ``rows[i].per_seed`` in the JSON).

Every value is the mean over seeds with the Student-t interval of ``tepo.compare.stats``. Higher is better for
accuracies and reward, lower for steps and wall time; ``best`` marks the best mean of each column (ties all
marked). An ``initial policy`` row gives the held-out accuracies before training. ``collapsed`` counts the runs
that meet :data:`tepo.compare.measures.COLLAPSE_RULE`.

Beside the columns, ``paired`` holds each measure's paired differences with their tests and Holm's adjustment
(:mod:`tepo.compare.paired`), ``aggregates`` rliable's IQM and probability of improvement, and ``problem_level``
the problem-by-problem view of runs with per-problem records (:mod:`tepo.compare.problems`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from tepo.compare.measures import (
    COLLAPSE_RULE,
    EVAL_BEFORE_FILE,
    STEP_SECONDS,
    _number,
    _read_json,
    benchmark_scores,
    collapsed,
    convergence,
    curve_auc,
    entropy_kept,
    grad_norm_cv,
    grad_norm_mean,
    held_out_curve,
    max_drop,
    run_machine,
    run_precision,
    steps_to_threshold,
    truncated_last_third,
)
from tepo.compare.paired import ALPHA, PAIRED_MEASURES, aggregates, paired_measures
from tepo.compare.problems import problem_level
from tepo.compare.record import run_state
from tepo.compare.render import (
    INITIAL_ROW,
)
from tepo.compare.stats import DEFAULT_CONFIDENCE, EXACT_SIGN_FLIP_MAX_N, T_INTERVAL, t_interval
from tepo.metrics import read_metrics

DEFAULT_CONVERGENCE_SHARE = 0.9
DEFAULT_REFERENCE = "grpo"


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    higher_is_better: bool = True
    benchmark: bool = False  # part of the average
    ranked: bool = True  # its best mean is marked (False for differences and for descriptive columns)


class RunValues(NamedTuple):
    """One finished run as the table reads it: column values after and before training, and the raw series
    (held-out curve, metrics rows) that the convergence columns need once the reference's final is known."""

    after: dict[str, float]
    before: dict[str, float]
    curve: list[tuple[int, float]]
    rows: list[dict]


class _Runs(NamedTuple):
    """What the table reads of every run: values by method and seed, the raw series, precision, machine, the
    initial policy's scores by seed, and the runs not finished."""

    per_method: dict[str, dict[int, dict]]
    series: dict[tuple[str, int], RunValues]
    precision: dict[tuple[str, int], str]
    machine: dict[tuple[str, int], str | None]
    initial: dict[int, dict]
    missing: list[str]


def _pass_at_k(scores: dict) -> dict[str, float | None]:
    """``{"pass@k": value}`` from an evaluation's ``eval_pass@k`` keys (eval.pass_k_samples; absent when off)."""
    return {k.removeprefix("eval_"): _number(v) for k, v in scores.items() if k.startswith("eval_pass@")}


def _pass_k_keys(values: list[dict]) -> list[str]:
    """The pass@k columns some run has, by k."""
    return sorted({k for v in values for k in v if k.startswith("pass@")}, key=lambda k: int(k.split("@")[1]))


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
    values |= _pass_at_k(after)
    steps, seconds = steps_to_threshold(rows, threshold, window)
    values["steps_to_threshold"] = None if steps is None else float(steps)
    values["seconds_to_threshold"] = seconds
    curve = held_out_curve(run_dir, rows=rows)
    values["auc_held_out"] = curve_auc(curve)
    values["held_out_drop"] = max_drop(curve)
    values["entropy_kept"] = entropy_kept(rows)
    values["grad_norm"] = grad_norm_mean(rows)
    values["grad_norm_cv"] = grad_norm_cv(rows)
    collapse = collapsed(
        _number(before.get("eval_greedy_accuracy")), values["held_out"], truncated_last_third(rows)
    )
    values["collapsed"] = None if collapse is None else float(collapse)
    step_seconds = [float(r[STEP_SECONDS]) for r in rows if _number(r.get(STEP_SECONDS)) is not None]
    if step_seconds:
        values["seconds_per_step"] = statistics.median(step_seconds)
    initial = {
        "held_out": _number(before.get("eval_greedy_accuracy")),
        "sampled": _number(before.get("eval_sampled_accuracy")),
        "sampled_cons": _number(before.get("eval_sampled_cons")),
        **_pass_at_k(before),
    }
    return RunValues(
        after={k: v for k, v in values.items() if v is not None},
        before={k: v for k, v in initial.items() if v is not None},
        curve=curve,
        rows=rows,
    )


def _read_runs(runs: dict[str, dict[int, Path]], threshold: float, window: int) -> _Runs:
    """Every finished run's values, series, precision and machine; the unfinished ones by name."""
    read = _Runs({}, {}, {}, {}, {}, [])
    for method, seeds in runs.items():
        for seed, run_dir in sorted(seeds.items()):
            if run_state(run_dir) != "finished":
                read.missing.append(f"{method}/seed{seed}")
                continue
            values = read.series[method, seed] = run_values(run_dir, threshold=threshold, window=window)
            read.per_method.setdefault(method, {})[seed] = values.after
            read.precision[method, seed] = run_precision(run_dir)
            read.machine[method, seed] = run_machine(run_dir)
            # identical across methods for one seed: the same initial policy
            read.initial.setdefault(seed, values.before)
    return read


def _add_convergence(read: _Runs, target: float | None) -> None:
    """``steps_to_share`` / ``seconds_to_share`` of every run that reached ``target`` on its held-out curve."""
    if target is None:
        return
    for method, seeds in read.per_method.items():
        for seed, values in seeds.items():
            step, secs = convergence(read.series[method, seed].curve, read.series[method, seed].rows, target)
            if step is not None:
                values["steps_to_share"], values["seconds_to_share"] = float(step), secs


def _pair_with_reference(read: _Runs, reference: str) -> tuple[set[tuple[str, int]], list[str]]:
    """The (method, seed) runs that pair with the reference's run of their seed, and why the others do not.

    Runs of another precision, or recorded on another machine, are not paired: float arithmetic differs between
    them (a run that recorded no machine is taken to share its seed's machine). Paired runs get
    ``held_out_delta``, the per-seed difference in final held-out accuracy."""
    pairable, unpaired = set(), []
    reference_by_seed = read.per_method.get(reference, {})
    for method, seeds in read.per_method.items():
        if method == reference:
            continue
        for seed, values in seeds.items():
            if seed not in reference_by_seed:
                continue
            if read.precision[method, seed] != read.precision[reference, seed]:
                unpaired.append(
                    f"{method}/seed{seed} ({read.precision[method, seed]}) vs {reference} "
                    f"({read.precision[reference, seed]})"
                )
                continue
            machines = read.machine[method, seed], read.machine[reference, seed]
            if None not in machines and machines[0] != machines[1]:
                unpaired.append(f"{method}/seed{seed} ({machines[0]}) vs {reference} ({machines[1]})")
                continue
            pairable.add((method, seed))
            ref = reference_by_seed[seed]
            if "held_out" in values and "held_out" in ref:
                values["held_out_delta"] = values["held_out"] - ref["held_out"]
    return pairable, unpaired


def _columns(per_method: dict, reference: str, threshold: float, convergence_share: float) -> list[Column]:
    benches = sorted(
        {k for seeds in per_method.values() for v in seeds.values() for k in v if k.startswith("bench:")}
    )
    columns = [Column("held_out", "held-out", True, True)]
    columns += [Column(b, b.split(":", 1)[1], True, True) for b in benches]
    if len(columns) >= 2:
        columns.append(Column("avg", "avg", True, False))
    r_label = f"{threshold:g}"
    all_values = [v for seeds in per_method.values() for v in seeds.values()]
    return [
        *columns,
        Column("sampled", "sampled"),
        *([Column("sampled_cons", "cons@n")] if any("sampled_cons" in v for v in all_values) else []),
        *(Column(k, k) for k in _pass_k_keys(all_values)),
        Column("reward", "reward (last 1/3)"),
        Column("steps_to_threshold", f"steps@{r_label}", higher_is_better=False),
        Column("seconds_to_threshold", f"wall s@{r_label}", higher_is_better=False),
        Column("steps_to_share", f"steps@{convergence_share:.0%} {reference}", higher_is_better=False),
        Column("seconds_to_share", f"wall s@{convergence_share:.0%} {reference}", higher_is_better=False),
        Column("auc_held_out", "held-out AUC"),
        Column("held_out_drop", "held-out max drop", higher_is_better=False, ranked=False),
        Column("entropy_kept", "entropy kept", ranked=False),
        Column("grad_norm", "grad norm", ranked=False),
        Column("grad_norm_cv", "grad norm cv", ranked=False),
        Column("collapsed", "collapsed", higher_is_better=False, ranked=False),
        Column("held_out_delta", f"Δ held-out vs {reference} (paired)", ranked=False),
        Column("seconds_per_step", "s/step", higher_is_better=False),
    ]


def _cell(values: list[float], total: int, confidence: float) -> dict:
    """Mean over seeds with its Student-t interval; ``of``: the seeds the method ran (some may lack the value)."""
    if not values:
        return {"mean": None, "low": None, "high": None, "n": 0, "values": [], "of": total}
    return t_interval(values, confidence=confidence).to_dict() | {"of": total}


def _method_rows(read: _Runs, columns: list[Column], reference: str, paired: dict, confidence: float) -> list:
    bench_keys = [c.key for c in columns if c.benchmark]
    rows = []
    for method, seeds in read.per_method.items():
        for values in seeds.values():
            if len(bench_keys) >= 2 and all(k in values for k in bench_keys):
                values["avg"] = sum(values[k] for k in bench_keys) / len(bench_keys)
        cells = {
            c.key: _cell([v[c.key] for v in seeds.values() if c.key in v], len(seeds), confidence)
            for c in columns
        }
        # The paired difference carries its tests (tepo.compare.paired); the reference has no difference with itself.
        cells["held_out_delta"] = (
            _cell([], 0, confidence)
            if method == reference
            else paired["held_out"][method] | {"of": len(seeds)}
        )
        rows.append(
            {
                "method": method,
                "seeds": sorted(seeds),
                "cells": cells,
                "per_seed": {str(seed): dict(values) for seed, values in sorted(seeds.items())},
                "precision": sorted({read.precision[method, seed] for seed in seeds}),
            }
        )
    return rows


def _mark_best(rows: list[dict], columns: list[Column]) -> None:
    """``best`` on the best mean of each ranked column; steps and wall time compare only the methods whose share
    of seeds reaching the threshold is the largest."""
    for column in columns:
        cells = [r["cells"][column.key] for r in rows]
        if not column.ranked:
            for cell in cells:
                cell["best"] = False
            continue
        means = [c["mean"] for c in cells]
        shares = [c["n"] / max(c["of"], 1) for c in cells]
        eligible = [
            m is not None and (column.higher_is_better or s == max(shares)) for m, s in zip(means, shares)
        ]
        candidates = [m for m, ok in zip(means, eligible) if ok]
        best = (max if column.higher_is_better else min)(candidates) if candidates else None
        for cell, mean, ok in zip(cells, means, eligible):
            cell["best"] = bool(
                len(rows) > 1
                and ok
                and best is not None
                and math.isclose(mean, best, rel_tol=1e-12, abs_tol=1e-12)
            )


def _initial_row(initial: dict[int, dict], confidence: float) -> dict | None:
    cells = {}
    for key in ("held_out", "sampled", "sampled_cons", *_pass_k_keys(list(initial.values()))):
        vals = [v[key] for v in initial.values() if key in v]
        if vals:
            cells[key] = _cell(vals, len(initial), confidence) | {"best": False}
    if not cells:
        return None
    return {
        "method": INITIAL_ROW,
        "seeds": sorted(initial),
        "cells": cells,
        "per_seed": {str(seed): dict(values) for seed, values in sorted(initial.items())},
    }


def _paired_seeds(paired: dict) -> dict[str, list[int]]:
    return {method: cell["seeds"] for method, cell in paired.get("held_out", {}).items()}


def build_table(
    runs: dict[str, dict[int, Path]],
    *,
    threshold: float = 0.5,
    window: int = 3,
    confidence: float = DEFAULT_CONFIDENCE,
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
    read = _read_runs(runs, threshold, window)
    ref_finals = [v["held_out"] for v in read.per_method.get(reference, {}).values() if "held_out" in v]
    ref_final = sum(ref_finals) / len(ref_finals) if ref_finals else None
    target = None if ref_final is None else convergence_share * ref_final
    _add_convergence(read, target)
    pairable, unpaired = _pair_with_reference(read, reference)
    columns = _columns(read.per_method, reference, threshold, convergence_share)
    all_values = [v for seeds in read.per_method.values() for v in seeds.values()]
    paired = paired_measures(
        read.per_method, reference, pairable, [*PAIRED_MEASURES, *_pass_k_keys(all_values)]
    )
    rows = _method_rows(read, columns, reference, paired, confidence)
    _mark_best(rows, columns)
    return {
        "columns": [
            {"key": c.key, "label": c.label, "higher_is_better": c.higher_is_better, "benchmark": c.benchmark}
            for c in columns
        ],
        "rows": rows,
        "initial": _initial_row(read.initial, confidence),
        "missing_runs": read.missing,
        # Runs of different precision share the table only with a column that says so, and are never paired.
        "precision": {"mixed": len(set(read.precision.values())) > 1, "unpaired": unpaired},
        "threshold": {"metric": "reward_mean", "value": threshold, "window": window},
        "convergence": {
            "metric": "eval_greedy_accuracy",
            "reference": reference,
            "share": convergence_share,
            "reference_final_mean": ref_final,
            "reference_seeds": len(ref_finals),
            "target": target,
        },
        "paired": paired,
        "aggregates": aggregates(read.per_method, reference),
        "problem_level": problem_level(runs, reference, _paired_seeds(paired)),
        "statistics": {
            "interval": T_INTERVAL,
            "confidence": confidence,
            "paired_test": f"sign-flip, exact over 2^n sign assignments up to n = {EXACT_SIGN_FLIP_MAX_N}",
            "adjustment": "holm",
            "alpha": ALPHA,
            "unit": "seed",
            "collapse": COLLAPSE_RULE,
        },
    }
