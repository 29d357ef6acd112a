"""Fair side-by-side comparisons: every method x seed under identical settings, and the table with intervals.

- ``tepo.compare.planning``: the plan (``plan_comparison``); ``tepo.compare.runner``: run/reuse/resume
  (``run_comparison``); ``tepo.compare.record``: ``comparison.json`` and the runs on disk (``discover_runs``);
  ``tepo.compare.sharing``: one initial evaluation per evaluation key,
- ``tepo.compare.table``: the comparison table (``build_table``); ``tepo.compare.measures``: what one run's files
  say (``held_out_curve``, ``convergence``, ``curve_auc``, ``steps_to_threshold``); ``tepo.compare.render``: the
  table as Markdown and terminal text, and its files (``render_markdown``, ``render_terminal``, ``write_table``),
- ``tepo.compare.stats``: small-sample intervals and tests over seeds and problems; ``tepo.compare.power``: seeds
  needed for a target difference,
- the ``tepo compare`` command lives in ``tepo.report.compare_cli`` (it writes the report, so it sits above both).

The default comparison task, ``arithmetic-mix``, is a procedural task in :mod:`tepo.data.tasks`.
"""

from tepo.compare.measures import convergence, curve_auc, held_out_curve, steps_to_threshold
from tepo.compare.planning import ComparisonPlan, RunSpec, parse_methods, parse_seeds, plan_comparison
from tepo.compare.record import discover_runs
from tepo.compare.render import render_markdown, render_terminal, write_table
from tepo.compare.runner import run_comparison
from tepo.compare.sharing import eval_sharing_key
from tepo.compare.stats import Interval, holm, paired_t_p, sign_flip_p, t_interval
from tepo.compare.table import build_table

__all__ = [
    "ComparisonPlan",
    "Interval",
    "RunSpec",
    "build_table",
    "convergence",
    "curve_auc",
    "discover_runs",
    "eval_sharing_key",
    "held_out_curve",
    "holm",
    "paired_t_p",
    "parse_methods",
    "parse_seeds",
    "plan_comparison",
    "render_markdown",
    "render_terminal",
    "run_comparison",
    "sign_flip_p",
    "steps_to_threshold",
    "t_interval",
    "write_table",
]
