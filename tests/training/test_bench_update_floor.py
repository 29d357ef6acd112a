"""benchmarks/bench_update_floor.py at a toy size: the three sides run and the table compares them (slow: three
copies of the embedded model)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.slow
def test_a_tiny_run_times_the_update_against_its_floor():
    size = ["--rows", "4", "--group", "2", "--max-new", "4", "--mean-len", "3", "--micro", "2"]
    command = [sys.executable, str(BENCHMARKS / "bench_update_floor.py"), *size, "--rounds", "1", "--threads", "1"]
    printed = subprocess.run(command, capture_output=True, text=True, timeout=1200)
    assert printed.returncode == 0, printed.stdout[-3000:] + printed.stderr[-3000:]
    rows = {line.split("|")[1].strip(): line for line in printed.stdout.splitlines() if line.startswith("| ")}
    assert {"update", "update_no_ckpt", "floor"} <= set(rows)
    assert rows["floor"].split("|")[4].strip() == "1.00"  # the floor against itself
