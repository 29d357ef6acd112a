"""``tepo compare`` (registered by ``tepo.cli`` through :func:`register`).

tepo compare --losses grpo,tepo --seeds 3 [--config compare_default] [--dir DIR] [key=value ...]

A command-line module: it sits at the top layer with ``tepo.cli``, so it may write the HTML report
(:mod:`tepo.report`) after the table.
"""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_THRESHOLD = 0.3  # batch reward; the default task starts near 0.05 (see docs/compare.md)


def _cmd_compare(args) -> int:
    from tepo.compare.runner import parse_methods, parse_seeds, plan_comparison, run_comparison
    from tepo.compare.table import build_table, render_terminal, write_table

    methods, seeds = parse_methods(args.losses), parse_seeds(args.seeds)
    directory = Path(args.dir) if args.dir else Path("comparisons") / "_vs_".join(methods)
    plan = plan_comparison(directory, methods, seeds, config=args.config, overrides=args.overrides)
    print(f"comparison: {len(methods)} methods x {len(seeds)} seeds -> {directory}")
    for note in plan.notes:
        print(f"note: {note}")
    if not args.table_only:
        outcomes = run_comparison(plan)
        done = {}
        for outcome in outcomes:
            done[outcome.action] = done.get(outcome.action, 0) + 1
        print("runs: " + ", ".join(f"{n} {action}" for action, n in sorted(done.items())))
    table = build_table(
        {m: {s: directory / m / f"seed{s}" for s in seeds} for m in methods},
        threshold=args.threshold,
        window=args.window,
    )
    md, js = write_table(table, directory)
    print()
    print(render_terminal(table))
    print(f"\ntable: {md} (JSON: {js})")
    if not args.no_report:
        from tepo.report.html import build_report

        result = build_report(directory, threshold=args.threshold, window=args.window)
        print(f"report: {result.html_path}")
    return 0


def threshold_args(p: argparse.ArgumentParser) -> None:
    """--threshold and --window, shared by `tepo compare` and `tepo report`."""
    p.add_argument(
        "--threshold",
        type=float,
        default=DEFAULT_THRESHOLD,
        help=f"batch reward for the steps-to-threshold column (default {DEFAULT_THRESHOLD})",
    )
    p.add_argument(
        "--window", type=int, default=3, help="trailing steps averaged before comparing (default 3)"
    )


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "compare",
        help="train every loss x seed under identical settings and tabulate the results",
        description="Train every method x seed under identical settings (same prompts, same sampling seeds), "
        "reuse finished runs, resume interrupted ones, then print the comparison table.",
    )
    p.add_argument(
        "--losses",
        required=True,
        help="comma list of losses (tepo losses) or presets (tepo presets), e.g. grpo,dapo,tepo,tepo_kl",
    )
    p.add_argument("--seeds", default="3", help="number of seeds (3 -> 0,1,2) or a comma list (default 3)")
    p.add_argument("--config", help="base preset or YAML for every run (default: compare_default)")
    p.add_argument("--dir", help="comparison directory (default: comparisons/<loss1>_vs_<loss2>...)")
    p.add_argument("--table-only", action="store_true", help="do not train: tabulate the runs that exist")
    p.add_argument("--no-report", action="store_true", help="skip the HTML report")
    threshold_args(p)
    p.add_argument(
        "overrides", nargs="*", metavar="key=value", help="applied to every run, e.g. train.steps=10"
    )
    p.set_defaults(func=_cmd_compare)
