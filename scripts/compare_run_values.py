"""Are two runs the same run? Every non-timing value of their metrics logs and held-out scores, compared exactly.

    .venv/bin/python scripts/compare_run_values.py RUN_DIR_BEFORE RUN_DIR_AFTER

For a change that must not change behaviour (a refactor, a default that resolves to today's path): run the same
command on the code before and after (e.g. ``tepo train train.steps=3`` in a ``git worktree`` of each, with
``PYTHONPATH=<worktree>/src``) and compare. Metric names are read through ``tepo.metrics.read_metrics``, so a log
written with the flat names of older versions compares with a grouped one. Timing and memory values (seconds,
tokens/s, peak memory) are skipped; everything else must be equal, bit for bit. Exits 1 on any difference.

``--without-eval``: the training steps only, for an "after" run made with ``eval.size=0`` where the held-out
evaluations cost more than the machine has (their values, ``eval/...`` and ``summary.json``, are skipped; the
steps' sampling and update do not depend on them: each step samples with its own seed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tepo.metrics import read_metrics

TIMING_PARTS = ("seconds", "per_s", "memory", "rss", "time/", "_mb")


def is_timing(key: str) -> bool:
    return any(part in key for part in TIMING_PARTS)


def compare(before: Path, after: Path, *, without_eval: bool = False) -> tuple[int, list[str]]:
    """(values compared, lines naming each difference); ``without_eval``: the steps' non-eval values only."""
    rows_a, rows_b = read_metrics(before / "metrics.jsonl"), read_metrics(after / "metrics.jsonl")
    if len(rows_a) != len(rows_b):
        return 0, [f"metrics.jsonl: {len(rows_a)} rows against {len(rows_b)}"]
    compared, diffs = 0, []
    for a, b in zip(rows_a, rows_b):
        for key in sorted(a.keys() | b.keys()):
            if is_timing(key) or (without_eval and key.startswith("eval/")):
                continue
            compared += 1
            if a.get(key, "<missing>") != b.get(key, "<missing>"):
                diffs.append(
                    f"step {a.get('step')}: {key}: {a.get(key, '<missing>')!r} != {b.get(key, '<missing>')!r}"
                )
    if without_eval:
        return compared, diffs
    summary_a = json.loads((before / "summary.json").read_text())
    summary_b = json.loads((after / "summary.json").read_text())
    for part in ("before", "after"):
        for key in sorted(summary_a.get(part, {}).keys() | summary_b.get(part, {}).keys()):
            if is_timing(key):
                continue
            compared += 1
            x, y = (
                summary_a.get(part, {}).get(key, "<missing>"),
                summary_b.get(part, {}).get(key, "<missing>"),
            )
            if x != y:
                diffs.append(f"summary.json {part}: {key}: {x!r} != {y!r}")
    return compared, diffs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument(
        "--without-eval", action="store_true", help="compare the steps only (no eval/, no summary)"
    )
    args = parser.parse_args(argv)
    compared, diffs = compare(args.before, args.after, without_eval=args.without_eval)
    print("\n".join(diffs))
    print(f"compared {compared} values, {len(diffs)} differ")
    return 1 if diffs or not compared else 0


if __name__ == "__main__":
    sys.exit(main())
