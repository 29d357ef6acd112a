"""The committed study runs under docs/results/ were logged with flat metric names (before tepo.metrics.names
grouped them): read through ``read_metrics`` they still give the committed tables, to the byte."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tepo.compare.render import render_markdown
from tepo.compare.runner import discover_runs
from tepo.compare.table import build_table
from tepo.metrics import read_metrics
from tepo.report.compare_cli import DEFAULT_THRESHOLD

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
STUDIES = sorted(p.parent.name for p in RESULTS.glob("*/table.md") if (p.parent / "comparison.json").exists())


def test_the_studies_are_there():
    assert {"async-and-lora", "tepo-claims", "tepo-offpolicy"} <= set(STUDIES)


@pytest.mark.parametrize("study", STUDIES)
def test_a_committed_study_regenerates_its_table(study):
    directory = RESULTS / study
    some_log = next(directory.glob("*/seed0/metrics.jsonl"))
    first = json.loads(some_log.read_text().splitlines()[0])
    assert "reward_mean" in first and "reward/mean" not in first, "the committed logs have the old flat names"
    assert "reward/mean" in read_metrics(some_log)[0]
    table = build_table(discover_runs(directory), threshold=DEFAULT_THRESHOLD)  # `tepo compare --table-only`
    assert render_markdown(table) == (directory / "table.md").read_text()
    committed = json.loads((directory / "table.json").read_text())
    # Rows gained a "precision" entry after some studies were committed; every other value is the same.
    rows = [{k: v for k, v in row.items() if k != "precision"} for row in table["rows"]]
    assert rows == committed["rows"] and table["initial"] == committed["initial"]
