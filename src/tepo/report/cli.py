"""``tepo report`` (registered by ``tepo.cli`` through :func:`register`).

tepo report RUN_DIR_OR_COMPARISON_DIR
"""

from __future__ import annotations

from pathlib import Path

from tepo.report.compare_cli import table_options, threshold_args


def _cmd_report(args) -> int:
    from tepo.report.html import build_report

    try:
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
    p.set_defaults(func=_cmd_report)
