"""docs/parity.md is generated from tests/parity_rows.py, and every test a row names exists."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from parity_rows import FIELDS, ROWS, render

ROOT = Path(__file__).resolve().parents[1]


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
