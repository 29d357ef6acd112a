"""Per method of a `tepo compare` directory: a training metric's mean over the steps of each run, then the mean
and range over seeds, as a Markdown table. Used by results pages for what the comparison table does not carry
(gradient norm, entropy at a step); it reads only the committed metrics.jsonl files.

    python scripts/curve_summary.py docs/results/tepo-claims update/grad_norm update/entropy_mean@30 reward/mean

A metric name alone averages every logged step; ``name@K`` takes step K only. Finished runs only (summary.json).
Names are those of ``metrics.jsonl``, grouped by phase (``update/grad_norm``; ``tepo.metrics.names``), or the flat
names runs logged before the grouping (``grad_norm``): either spelling reads old and new runs alike.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path


def run_value(metrics_path: Path, metric: str) -> float | None:
    from tepo.metrics import metric_name, read_metrics

    name, _, at = metric.partition("@")
    name = metric_name(name)  # a flat name (reward_mean) as its grouped one (reward/mean)
    values = []
    # The package's reader: grouped names, a torn last line skipped.
    for row in read_metrics(metrics_path):
        value = row.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if at and row.get("step") != int(at):
            continue
        values.append(float(value))
    return statistics.fmean(values) if values else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("metrics", nargs="+", help="metric names of metrics.jsonl, optionally name@step")
    args = parser.parse_args(argv)
    methods = sorted(p for p in args.directory.iterdir() if p.is_dir() and any(p.glob("seed*/summary.json")))
    if not methods:
        print(f"{args.directory}: no finished runs (<method>/seed<k>/summary.json)", file=sys.stderr)
        return 2
    print("| method | seeds | " + " | ".join(args.metrics) + " |")
    print("|---|---|" + "---|" * len(args.metrics))
    for method_dir in methods:
        runs = sorted(p.parent for p in method_dir.glob("seed*/summary.json"))
        cells = []
        for metric in args.metrics:
            values = [v for r in runs if (v := run_value(r / "metrics.jsonl", metric)) is not None]
            if not values:
                cells.append("-")
                continue
            cells.append(f"{statistics.fmean(values):.3f} [{min(values):.3f}, {max(values):.3f}]")
        print(f"| {method_dir.name} | {len(runs)} | " + " | ".join(cells) + " |")
    print("\nmean over seeds [lowest, highest seed] of each run's mean over its steps (name@K: step K only)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
