"""``tepo report`` (registered by ``tepo.cli`` through :func:`register`).

tepo report RUN_DIR_OR_COMPARISON_DIR
tepo report COMPARISON_DIR --panels "grpo,sapo" "tepo,luspo" [--panel-titles A B] [--panels-out PNG]
"""

from __future__ import annotations

from pathlib import Path

from tepo.report.compare_cli import table_options, threshold_args


def _cmd_report(args) -> int:
    from tepo.report.html import build_report

    try:
        if args.panels:  # only the per-group figure
            from tepo.report.plots import plot_held_out_panels

            groups = [[m.strip() for m in group.split(",") if m.strip()] for group in args.panels]
            out = args.panels_out or Path(args.path) / "report" / "figures" / "held_out_panels.png"
            print(f"figure: {plot_held_out_panels(Path(args.path), groups, out, titles=args.panel_titles)}")
            return 0
        result = build_report(Path(args.path), **table_options(args))
    except ValueError as err:
        from tepo.config import ConfigError

        raise ConfigError(str(err)) from None
    print(f"report: {result.html_path}")
    for figure in result.figures:
        print(f"figure: {figure}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("report", help="HTML page and PNG figures for a run or a comparison directory")
    p.add_argument("path", metavar="RUN_DIR_OR_COMPARISON_DIR")
    threshold_args(p)
    p.add_argument(
        "--panels",
        nargs="+",
        metavar="METHODS",
        help="only the held-out accuracy figure, one panel per comma list of methods (a comparison directory)",
    )
    p.add_argument("--panel-titles", nargs="+", metavar="TITLE", help="one title per panel")
    p.add_argument(
        "--panels-out", type=Path, help="PNG to write (default: <dir>/report/figures/held_out_panels.png)"
    )
    p.set_defaults(func=_cmd_report)
