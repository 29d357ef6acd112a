"""What a run records as it trains, and the plain-text tables of it.

- :mod:`tepo.metrics.log`: the per-step ``metrics.jsonl`` log (the record of truth) and its TensorBoard / W&B sinks,
- :mod:`tepo.metrics.tokens`: per-token rollout records (``samples/step_XXXXXX.json``) for the token view,
- :mod:`tepo.metrics.catalogue`: the metric groups and every name a run logs (``reward/mean``),
- :mod:`tepo.metrics.names`: the map that reads old logs' flat names,
- :mod:`tepo.metrics.tables`: plain-text / Markdown tables.

Readers, plots and the HTML report of these records live in :mod:`tepo.report`.
"""

from __future__ import annotations

from tepo.metrics.catalogue import in_group
from tepo.metrics.log import MetricsLog, read_metrics, truncate_metrics
from tepo.metrics.names import canonical, metric_name

__all__ = ["MetricsLog", "canonical", "in_group", "metric_name", "read_metrics", "truncate_metrics"]
