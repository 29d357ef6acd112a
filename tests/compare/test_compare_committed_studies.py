"""The committed study runs under docs/results/ were logged with flat metric names (before tepo.metrics.names
grouped them): read through ``read_metrics`` they still give the committed tables, to the byte."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tepo.compare.record import discover_runs
from tepo.compare.render import render_markdown
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
    def without_precision(rows):
        return [{k: v for k, v in row.items() if k != "precision"} for row in rows]

    assert without_precision(table["rows"]) == without_precision(committed["rows"])
    assert table["initial"] == committed["initial"]


def test_the_claims_study_new_seeds_have_pass_at_k_and_are_paired_within_one_machine():
    """Issue 46: seeds 3-5 ran with eval.pass_k_samples=8 on one machine; the table carries their pass@k and
    pairs each with grpo's run of the same seed."""
    directory = RESULTS / "tepo-claims"
    runs = discover_runs(directory)
    finished = {
        (method, seed): json.loads((path / "summary.json").read_text())
        for method, seeds in runs.items()
        for seed, path in seeds.items()
        if seed >= 3 and (path / "summary.json").exists()
    }
    assert ("grpo", 3) in finished, "the first new run is committed"
    machines = {(s["precision"]["hardware"], s["precision"]["native_bf16"]) for s in finished.values()}
    assert machines == {("AMD EPYC", True)}, "all new runs on one machine (README: Zen 4, avx512_bf16)"
    table = build_table(runs, threshold=DEFAULT_THRESHOLD)
    assert {"pass@1", "pass@2", "pass@4", "pass@8"} <= {c["key"] for c in table["columns"]}
    rows = {row["method"]: row for row in table["rows"]}
    for method, seed in finished:
        values = rows[method]["per_seed"][str(seed)]
        passes = [values[f"pass@{k}"] for k in (1, 2, 4, 8)]
        assert 0 <= passes[0] <= passes[1] <= passes[2] <= passes[3] <= 1, (method, seed, passes)
        if method != "grpo" and ("grpo", seed) in finished:
            assert "held_out_delta" in values, f"{method} seed {seed} is not paired with grpo"


def test_the_claims_study_has_six_seeds_of_the_claim_methods_and_three_of_the_token_level_ones():
    """Issue 46's "done when": `tepo compare --table-only` rebuilds six seeds of the four claim methods and seeds
    3-5 of each token-level method, every run finished (none left out of the table)."""
    table = build_table(discover_runs(RESULTS / "tepo-claims"), threshold=DEFAULT_THRESHOLD)
    rows = {row["method"]: row for row in table["rows"]}
    for method in ("grpo", "dapo", "tepo", "tepo_v2_kl_mask"):
        assert sorted(rows[method]["per_seed"], key=int) == ["0", "1", "2", "3", "4", "5"], method
    for method in ("ep_grpo", "erpo", "entropy_adv"):
        assert sorted(rows[method]["per_seed"], key=int) == ["3", "4", "5"], method
    assert not table.get("missing_runs"), table.get("missing_runs")
