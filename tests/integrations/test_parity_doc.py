"""docs/parity.md is generated from tests/parity_rows.py, and every test a row names exists."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from parity_rows import FIELDS, ROWS, covered, render

ROOT = Path(__file__).resolve().parents[2]


def test_parity_page_is_current():
    page = ROOT / "docs" / "parity.md"
    assert page.read_text() == render(), (
        "docs/parity.md is stale: python tests/parity_rows.py > docs/parity.md"
    )


def test_every_row_is_complete():
    for row in ROWS:
        assert set(row) == set(FIELDS), row["name"]
        assert all(row[field] for field in FIELDS), row["name"]


@pytest.mark.parametrize("reference", sorted({test for row in ROWS for test in row["tests"]}))
def test_every_named_test_exists(reference):
    path, _, name = reference.partition("::")
    source = ROOT / path
    assert source.is_file(), reference
    tests = {
        node.name for node in ast.walk(ast.parse(source.read_text())) if isinstance(node, ast.FunctionDef)
    }
    assert name in tests, f"{reference}: no such test"


def _registered() -> dict[str, list[str]]:
    from tepo.advantages import ADVANTAGE_ESTIMATORS
    from tepo.losses import KL_ESTIMATORS, POLICY_LOSSES
    from tepo.losses.rollout_correction import ROLLOUT_CORRECTIONS

    return {
        "loss": sorted(POLICY_LOSSES),
        "advantage": sorted(ADVANTAGE_ESTIMATORS),
        "KL": sorted(KL_ESTIMATORS),
        # "none" is the absence of a correction, not a name any framework shares
        "rollout correction": sorted(set(ROLLOUT_CORRECTIONS) - {"none"}),
    }


def test_every_registered_name_has_a_row():
    """A registered loss, advantage estimator, KL estimator or rollout correction without a row on the page fails,
    naming each missing row (a row covers the backticked names of its ``name`` cell, by kind: see
    ``parity_rows.covered``)."""
    missing = [
        f"{kind} `{name}`"
        for kind, names in _registered().items()
        for name in names
        if name not in covered(kind)
    ]
    assert not missing, (
        "docs/parity.md has no row for: "
        + ", ".join(missing)
        + ". Add a row to tests/parity_rows.py whose name "
        "cell names it in backticks with its kind ('(advantage)', '(KL)', '(rollout ...)'; losses: any other row), "
        "saying what TRL and verl compute for it ('none' where they have no equal) and the test that backs it."
    )
