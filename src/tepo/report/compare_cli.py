"""``tepo compare`` (registered by ``tepo.cli`` through :func:`register`).

tepo compare --losses grpo,tepo --seeds 3 [--config compare_default] [--dir DIR] [key=value ...]

A command-line module: it sits at the top layer with ``tepo.cli``, so it may write the HTML report
(:mod:`tepo.report`) after the table.
"""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_CONVERGENCE_SHARE = (
    0.9  # tepo.compare.table's (not imported: the CLI stays light until a command runs)
)
DEFAULT_THRESHOLD = 0.3  # batch reward; the default task starts near 0.05 (see docs/compare.md)


def _cmd_compare(args) -> int:
    from tepo.compare.planning import parse_methods, parse_seeds, plan_comparison
    from tepo.compare.record import discover_runs
    from tepo.compare.render import render_markdown, render_terminal, select_columns, write_table
    from tepo.compare.runner import run_comparison
    from tepo.compare.table import build_table
    from tepo.config import ConfigError

    if args.table_only:
        # No plan, no config, no data: the table comes from the run directories' small files alone.
        if not args.dir:
            raise ConfigError("--table-only needs --dir (the comparison directory to tabulate)")
        directory = Path(args.dir)
        if args.losses:  # the planned layout: <method>/seed<k>/ for the given methods and seeds
            methods, seeds = parse_methods(args.losses), parse_seeds(args.seeds)
            runs = {m: {s: directory / m / f"seed{s}" for s in seeds} for m in methods}
        else:  # whatever the directory holds (comparison.json, else <method>/seed<k>/config.yaml)
            runs = discover_runs(directory)
        if not runs:
            raise ConfigError(
                f"--dir {directory}: no runs found (expected comparison.json or <method>/seed<k>/config.yaml)"
            )
        print(f"comparison: {len(runs)} methods in {directory} (table only)")
    else:
        if not args.losses:
            raise ConfigError("--losses is required (unless --table-only): e.g. --losses grpo,tepo")
        methods, seeds = parse_methods(args.losses), parse_seeds(args.seeds)
        directory = Path(args.dir) if args.dir else Path("comparisons") / "_vs_".join(methods)
        overrides = [*args.overrides, *([f"train.device={args.device}"] if args.device else [])]
        plan = plan_comparison(
            directory, methods, seeds, config=args.config, overrides=overrides, eval_seed=args.eval_seed
        )
        print(f"comparison: {len(methods)} methods x {len(seeds)} seeds -> {directory}")
        for note in plan.notes:
            print(f"note: {note}")
        outcomes = run_comparison(plan)
        done = {}
        for outcome in outcomes:
            done[outcome.action] = done.get(outcome.action, 0) + 1
        print("runs: " + ", ".join(f"{n} {action}" for action, n in sorted(done.items())))
        runs = {m: {s: directory / m / f"seed{s}" for s in seeds} for m in methods}
    try:
        table = build_table(runs, **table_options(args))
    except ValueError as err:
        raise ConfigError(str(err)) from None
    md, js = write_table(table, directory)  # always every column
    shown = table
    if args.columns:
        try:
            shown = select_columns(table, [k.strip() for k in args.columns.split(",") if k.strip()])
        except ValueError as err:
            raise ConfigError(str(err)) from None
    print()
    print(render_markdown(shown) if args.markdown else render_terminal(shown))
    print(f"\ntable: {md} (JSON: {js})")
    if args.hypotheses:
        _print_verdicts(table, args.hypotheses, directory)
    if args.export:
        from tepo.compare.export import export_comparison

        try:
            copied, unfinished = export_comparison(directory, Path(args.export))
        except ValueError as err:
            raise ConfigError(str(err)) from None
        print(
            f"exported the small files of {len(copied)} finished runs to {args.export}"
            + (f" ({len(unfinished)} unfinished left out)" if unfinished else "")
        )
    if not args.no_report:
        from tepo.report.html import build_report

        result = build_report(directory, **table_options(args))
        print(f"report: {result.html_path}")
    return 0


def _print_verdicts(table: dict, hypotheses_path: str, directory: Path) -> None:
    """Decide the pre-registered hypotheses of ``hypotheses_path`` from ``table``; write and print the verdicts."""
    from tepo.compare.hypotheses import (
        HypothesisError,
        decide_all,
        read_hypotheses,
        render_verdicts,
        write_verdicts,
    )
    from tepo.config import ConfigError

    try:
        hypotheses, alpha = read_hypotheses(hypotheses_path)
        verdicts = decide_all(table, hypotheses, alpha)
    except HypothesisError as err:
        raise ConfigError(f"--hypotheses {err}") from None
    reference = table.get("convergence", {}).get("reference")
    md, _ = write_verdicts(verdicts, reference, directory)
    print("\n" + render_verdicts(verdicts, reference) + f"verdicts: {md}")


def _eval_seed(text: str) -> int | None:
    if text.strip().lower() in ("none", "null"):
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'none', got {text!r}") from None


def table_options(args) -> dict:
    """The parsed table flags (:func:`threshold_args` and the convergence ones) as keyword arguments of
    ``build_table`` and ``build_report``."""
    return {
        "threshold": args.threshold,
        "window": args.window,
        "convergence_share": args.convergence_share,
        "reference": args.reference,
    }


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
    p.add_argument(
        "--convergence-share",
        type=float,
        default=DEFAULT_CONVERGENCE_SHARE,
        help="convergence columns: steps to this share of the reference method's seed-mean final held-out "
        f"accuracy (default {DEFAULT_CONVERGENCE_SHARE})",
    )
    p.add_argument(
        "--reference",
        default=None,
        help="reference method of the convergence columns (default: grpo if compared, else the first method)",
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
        help="comma list of losses (tepo losses) or presets (tepo presets), e.g. grpo,dapo,tepo,tepo_kl "
        "(required unless --table-only, where it selects and orders the methods tabulated)",
    )
    p.add_argument("--seeds", default="3", help="number of seeds (3 -> 0,1,2) or a comma list (default 3)")
    p.add_argument("--config", help="base preset or YAML for every run (default: compare_default)")
    p.add_argument(
        "--eval-seed",
        type=_eval_seed,
        default=0,
        help="the held-out draw every run is scored on (eval.seed; default 0), so paired differences are measured "
        "on the same problems; 'none' keeps the base config's (null: each run's train.seed)",
    )
    p.add_argument("--dir", help="comparison directory (default: comparisons/<loss1>_vs_<loss2>...)")
    p.add_argument(
        "--device",
        help="train.device of every run: auto (the default: cuda when available), cpu, cuda or cuda:N; "
        "the same as the override train.device=...",
    )
    p.add_argument(
        "--table-only",
        action="store_true",
        help="do not plan or train: tabulate the runs under --dir from their small files alone",
    )
    p.add_argument("--no-report", action="store_true", help="skip the HTML report")
    p.add_argument(
        "--columns",
        help="print only these columns, by key, in this order (e.g. held_out,held_out_delta,steps_to_share); "
        "table.md and table.json keep every column",
    )
    p.add_argument(
        "--markdown", action="store_true", help="print the table as Markdown (with the per-seed tables)"
    )
    p.add_argument(
        "--hypotheses",
        metavar="YAML",
        help="pre-registered hypotheses to decide from the table by their stated rules (tepo.compare.hypotheses); "
        "writes verdicts.md and verdicts.json beside the table",
    )
    p.add_argument(
        "--export",
        metavar="DEST",
        help="copy the plan and every finished run's small files (config, metrics, summaries, held-out records; "
        "no checkpoints or logs) to DEST, e.g. a study folder to commit (tepo.compare.export)",
    )
    threshold_args(p)
    p.add_argument(
        "overrides", nargs="*", metavar="key=value", help="applied to every run, e.g. train.steps=10"
    )
    p.set_defaults(func=_cmd_compare)
