"""The mechanisms of a pilot, one row per setting and method: where TEPO's sequence ratios lie against its clip
band, how often that clip and GRPO's token clip fire, TEPO v2's mask share and the size of its KL term, the
truncated share and whether the run collapsed (tepo.compare.measures.COLLAPSE_RULE).

    python scripts/pilot_mechanisms.py docs/results/tepo-decided/pilot
    python scripts/pilot_mechanisms.py --per-method docs/results/tepo-decided/main   # seeds pooled per method

Reads every ``<setting>/<method>/seed<k>/`` run under the directory (each setting a `tepo compare` directory), from
its metrics.jsonl, eval_before.json and summary.json. Per-step values are the logged ones (a loss metric is the
token-weighted mean over the step's micro-batches); "p50 of steps" is the median over the steps of the logged
per-update quantile, "max"/"min" the extreme over the steps. With ``--per-method`` the steps of a method's seeds
are pooled the same way, and the run-level values become the medians over its seeds and the count of collapsed
runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

COLUMNS = (
    "setting", "method", "steps", "updates/step", "seq ratio p10 / p50 / p90", "seq ratio min / max",
    "seq clip fire", "token clip share", "v2 mask share", "v2 KL term mean / max", "truncated (last 1/3)",
    "held-out before -> after", "collapsed",
)  # fmt: skip


def _series(rows: list[dict], name: str) -> list[float]:
    from tepo.compare.measures import _number

    return [float(r[name]) for r in rows if _number(r.get(name)) is not None]


def _summed(rows: list[dict], names: tuple[str, str]) -> list[float]:
    """Per step, the sum of the named shares that the step logged (a step that logged neither is left out)."""
    from tepo.compare.measures import _number

    out = []
    for row in rows:
        present = [float(row[n]) for n in names if _number(row.get(n)) is not None]
        if present:
            out.append(sum(present))
    return out


def _fmt(values: list[float], how=statistics.median, digits: int = 3) -> str:
    return "-" if not values else f"{how(values):.{digits}f}"


def run_series(run_dir: Path) -> dict:
    """One run's per-step mechanism series and its run-level values (held-out before/after, truncation,
    collapse)."""
    from tepo.compare.measures import EVAL_BEFORE_FILE, _read_json, collapsed, truncated_last_third
    from tepo.metrics import read_metrics

    rows = read_metrics(run_dir / "metrics.jsonl")
    names = ("optimizer_updates", "seq_ratio_p10", "seq_ratio_p50", "seq_ratio_p90", "seq_ratio_min")
    series = {name: _series(rows, f"update/{name}") for name in (*names, "seq_ratio_max")}
    series |= {name: _series(rows, f"update/{name}") for name in ("tepo_kl_mask_frac", "tepo_kl_mask")}
    series["fire"] = _summed(rows, ("update/seq_clip_frac_low", "update/seq_clip_frac_high"))
    series["token"] = _summed(rows, ("update/clip_frac_low", "update/clip_frac_high"))
    before = (_read_json(run_dir / EVAL_BEFORE_FILE) or {}).get("eval_greedy_accuracy")
    after = ((_read_json(run_dir / "summary.json") or {}).get("after") or {}).get("eval_greedy_accuracy")
    truncated = truncated_last_third(rows)
    return series | {
        "steps": len(rows),
        "before": before,
        "after": after,
        "truncated": truncated,
        "collapsed": collapsed(before, after, truncated),
    }


def _pooled(runs: list[dict], name: str) -> list[float]:
    return [v for run in runs for v in run[name]]


def cells(setting: str, method: str, runs: list[dict]) -> list[str]:
    """Table cells for one run, or for several runs of one method pooled: per-step values pooled over their
    steps (medians, means, extremes as the module docstring says), run-level values as median and counts."""
    s = lambda name: _pooled(runs, name)  # noqa: E731
    fire, token = s("fire"), s("token")
    fired = (
        f"{_fmt(fire, statistics.fmean, 4)} ({sum(f > 0 for f in fire)}/{len(fire)} steps)" if fire else "-"
    )
    truncated = [r["truncated"] for r in runs if r["truncated"] is not None]
    collapses = [r["collapsed"] for r in runs if r["collapsed"] is not None]
    held = [(r["before"], r["after"]) for r in runs if r["before"] is not None and r["after"] is not None]
    if len(runs) == 1:
        held_cell = "-" if not held else f"{held[0][0]:.3f} -> {held[0][1]:.3f}"
        collapse_cell = "-" if not collapses else ("yes" if collapses[0] else "no")
    else:  # the medians over the runs, and how many collapsed
        held_cell = (
            "-"
            if not held
            else (
                f"{statistics.median(b for b, _ in held):.3f} -> {statistics.median(a for _, a in held):.3f} (medians)"
            )
        )
        collapse_cell = "-" if not collapses else f"{sum(collapses)}/{len(collapses)}"
    return [
        setting,
        method,
        str(sum(r["steps"] for r in runs)),
        _fmt(s("optimizer_updates"), statistics.fmean, 1),
        " / ".join(_fmt(s(f"seq_ratio_p{q}")) for q in (10, 50, 90)),
        f"{_fmt(s('seq_ratio_min'), min)} / {_fmt(s('seq_ratio_max'), max)}",
        fired,
        f"{_fmt(token, statistics.fmean, 4)} (max {_fmt(token, max, 4)})" if token else "-",
        _fmt(s("tepo_kl_mask_frac"), statistics.fmean),
        f"{_fmt(s('tepo_kl_mask'), statistics.fmean, 4)} / {_fmt(s('tepo_kl_mask'), max, 4)}",
        "-" if not truncated else f"{statistics.median(truncated):.2f}",
        held_cell,
        collapse_cell,
    ]


def run_row(setting: str, method: str, run_dir: Path) -> list[str]:
    """One run's mechanisms as table cells (see the module docstring)."""
    return cells(setting, method, [run_series(run_dir)])


def _finished(comparison: Path) -> dict[str, dict[int, Path]]:
    from tepo.compare.record import discover_runs, run_state

    return {
        method: {seed: d for seed, d in sorted(seeds.items()) if run_state(d) == "finished"}
        for method, seeds in discover_runs(comparison).items()
    }


def mechanism_rows(root: Path) -> list[list[str]]:
    """One row per finished run of every setting (a `tepo compare` directory) under ``root``."""
    out = []
    for setting in sorted(p for p in root.iterdir() if p.is_dir()):
        for method, seeds in _finished(setting).items():
            for seed, run_dir in seeds.items():
                name = method if len(seeds) == 1 else f"{method} seed {seed}"
                out.append(run_row(setting.name, name, run_dir))
    return out


def method_rows(comparison: Path) -> list[list[str]]:
    """One row per method of one `tepo compare` directory, its finished seeds pooled (``--per-method``)."""
    out = []
    for method, seeds in _finished(comparison).items():
        if seeds:
            runs = [run_series(d) for d in seeds.values()]
            out.append(
                cells(comparison.name, f"{method} ({len(runs)} seed{'s' if len(runs) != 1 else ''})", runs)
            )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="the pilot's directory of `tepo compare` settings")
    parser.add_argument(
        "--per-method",
        action="store_true",
        help="DIRECTORY is one `tepo compare` directory: one row per method, its seeds pooled",
    )
    args = parser.parse_args(argv)
    if not args.directory.is_dir():
        print(f"{args.directory}: not a directory", file=sys.stderr)
        return 2
    from tepo.metrics.tables import format_table

    rows = method_rows(args.directory) if args.per_method else mechanism_rows(args.directory)
    if not rows:
        print(f"{args.directory}: no finished run yet", file=sys.stderr)
        return 2
    print(format_table(list(COLUMNS), rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
