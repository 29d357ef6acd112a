"""Tables and figures a person looks at: training curves, run summaries, comparisons."""

from tepo.report.plots import plot_training_curves
from tepo.report.tables import format_table, training_summary_table

__all__ = ["format_table", "plot_training_curves", "training_summary_table"]
