"""The linter is part of the test suite: a lint error fails the tests like any other defect."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_check_passes():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(ruff).exists():
        pytest.fail("ruff is not installed; install the dev extra (bash scripts/install.sh)")
    result = subprocess.run(
        [ruff, "check", "src", "tests", "benchmarks", "examples"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
