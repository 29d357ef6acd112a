"""What one run's files say, as the comparison table reads them: benchmark scores, steps (and seconds) to a
reward threshold, the held-out accuracy curve and its measures (convergence, area, largest drop), entropy kept,
the precision it trained at. The columns these feed are described in :mod:`tepo.compare.table`.

Metrics rows are those of :func:`tepo.metrics.read_metrics`: grouped names (``reward/mean``,
``time/step_seconds``; :mod:`tepo.metrics.names`) whether the run logged them grouped or, before the grouping,
flat. ``summary.json`` and ``eval_before.json`` keep their flat keys (``eval_greedy_accuracy``).
"""

from __future__ import annotations

import json
import math
from itertools import pairwise
from pathlib import Path

from tepo.metrics import read_metrics
from tepo.metrics.names import flat_name, metric_name

EVAL_BEFORE_FILE = (
    "eval_before.json"  # tepo.training.EVAL_BEFORE, named here so tables never import the trainer
)
_BENCH_KEYS = ("accuracy", "greedy_accuracy", "mean_accuracy")
REWARD = metric_name("reward_mean")
STEP_SECONDS = metric_name("step_seconds")
ENTROPY = metric_name("entropy_mean")
GRAD_NORM = metric_name("grad_norm")
TRUNCATED = metric_name("frac_truncated")
# A run collapsed when training left it worse than it started on the held-out set, or when it never learned to
# finish inside the response limit: the collapse that decided a third of the 64-token study's spread.
COLLAPSE_TRUNCATED_SHARE = 0.5
COLLAPSE_RULE = (
    "final held-out greedy accuracy below the initial policy's, or a truncated share of responses above "
    f"{COLLAPSE_TRUNCATED_SHARE:.0%} over the last third of the steps"
)


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
        seconds += _number(row.get(STEP_SECONDS)) or 0.0
        reward = _number(row.get(REWARD))
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
    ``eval_sampled_accuracy`` (one sample per problem at ``eval.temperature``), or their grouped names
    (``eval/greedy_accuracy``): the summaries are read by the flat name, the metrics rows by the grouped one.

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
    summary_key, row_key = flat_name(key), metric_name(key)
    if (acc := _number(before.get(summary_key))) is not None:
        points[0] = acc
    last_step = 0
    for row in rows:
        step = row.get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            last_step = max(last_step, step)
            if (acc := _number(row.get(row_key))) is not None:
                points[step] = acc
    if not rows and isinstance(summary.get("steps"), int):
        last_step = summary["steps"]
    final = _number((summary.get("after") or {}).get(summary_key))
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
        _number(r.get(STEP_SECONDS)) or 0.0
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
    """Mean ``update/entropy_mean`` of the last third of the logged steps divided by the first logged step's.

    The last third is ``max(1, n // 3)`` rows, as ``summary.json`` ``reward_last_third`` counts them. ``None``
    without entropy rows or with a first entropy of 0 (nothing to keep).
    """
    entropies = [float(r[ENTROPY]) for r in rows if _number(r.get(ENTROPY)) is not None]
    if not entropies or entropies[0] <= 0:
        return None
    last = entropies[-max(1, len(entropies) // 3) :]
    return sum(last) / len(last) / entropies[0]


def grad_norm_mean(rows: list[dict]) -> float | None:
    """Mean ``update/grad_norm`` (the pre-clip gradient norm of each step) over the steps that logged a finite one.

    TEPO v1 Fig. 3 claims "consistently higher" gradient norms than GRPO: paired by seed, this is the number
    that claim is checked on. A step with no update logs NaN and is left out; ``None`` without any.
    """
    norms = _finite_grad_norms(rows)
    return sum(norms) / len(norms) if norms else None


def _finite_grad_norms(rows: list[dict]) -> list[float]:
    """The steps' finite ``update/grad_norm`` values (a step with no update logs NaN; rows without it are skipped)."""
    norms = [float(r[GRAD_NORM]) for r in rows if _number(r.get(GRAD_NORM)) is not None]
    return [n for n in norms if math.isfinite(n)]


def grad_norm_cv(rows: list[dict]) -> float | None:
    """Coefficient of variation of ``update/grad_norm`` over a run's steps: population sd / mean of the finite
    pre-clip norms (the steps :func:`grad_norm_mean` averages); None with fewer than two such steps.

    "Steadier" gradient norms (the tepo-decided study's H3, after TEPO v1 Fig. 3) read as a smaller value: the norm
    moves less from step to step relative to its own size, so a method with larger norms is not penalised for
    their scale. The sd is the population one (divided by n): a description of the run, not an estimate.
    """
    norms = _finite_grad_norms(rows)
    if len(norms) < 2:
        return None
    mean = sum(norms) / len(norms)
    if mean <= 0:
        return None
    return math.sqrt(sum((n - mean) ** 2 for n in norms) / len(norms)) / mean


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


def run_machine(run_dir: Path) -> str | None:
    """The CPU (or GPU) a run trained on, as its summary records it (``precision.hardware``, runs since
    2026-12-05); None for older runs, which recorded no machine."""
    recorded = (_read_json(Path(run_dir) / "summary.json") or {}).get("precision")
    hardware = recorded.get("hardware") if isinstance(recorded, dict) else None
    return hardware if isinstance(hardware, str) and hardware else None


def truncated_last_third(rows: list[dict]) -> float | None:
    """Mean ``rollout/frac_truncated`` (responses that hit the token limit) over the last third of the steps that
    logged it (``max(1, n // 3)`` rows, as :func:`entropy_kept` counts them); None without such rows."""
    shares = [float(r[TRUNCATED]) for r in rows if _number(r.get(TRUNCATED)) is not None]
    if not shares:
        return None
    last = shares[-max(1, len(shares) // 3) :]
    return sum(last) / len(last)


def collapsed(initial: float | None, final: float | None, truncated: float | None) -> bool | None:
    """:data:`COLLAPSE_RULE`: ``final < initial`` or ``truncated > COLLAPSE_TRUNCATED_SHARE``; None when neither
    can be judged (no held-out pair and no truncation log)."""
    verdicts = []
    if initial is not None and final is not None:
        verdicts.append(final < initial - 1e-12)
    if truncated is not None:
        verdicts.append(truncated > COLLAPSE_TRUNCATED_SHARE)
    return any(verdicts) if verdicts else None
