"""benchmarks/bench_generation.py (issue #54): its table's ratios, and one candidate end to end with a real engine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import vllm_python_or_skip

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))


def _run(decode_ms, tokens_per_s, rows=32):
    return {
        "startup_s": 2.0,
        "prefill_ms": 500.0,
        "decode_ms": decode_ms,
        "tokens_per_s": tokens_per_s,
        "rows": rows,
    }


def _rows(printed: str) -> dict[str, list[str]]:
    return {
        cells[0]: cells
        for line in printed.splitlines()
        if line.startswith("| ") and not line.startswith("| candidate")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }


def test_the_table_gives_medians_against_today_and_the_floor(capsys):
    from bench_generation import print_table

    results = {
        "today": [_run(70.0, 400.0), _run(60.0, 420.0), _run(65.0, 410.0)],
        "block32": [_run(35.0, 800.0), _run(32.5, 820.0), _run(30.0, 900.0)],
        "rows64": [_run(104.0, 500.0, rows=64)],
    }
    print_table(results, floors=[10.0, 13.0, 20.0])
    rows = _rows(capsys.readouterr().out)
    assert rows["today"][4:] == ["65.0", "410", "1.00x", "1.00x", "5.00"]
    assert rows["block32"][4:] == ["32.5", "820", "2.00x", "2.00x", "2.50"]
    assert rows["rows64"][8] == "4.00"  # 104 ms for 64 rows is 52 ms per 32 rows, over a 13 ms floor


def test_without_today_the_first_candidate_is_the_reference(capsys):
    from bench_generation import print_table

    print_table({"block32": [_run(30.0, 800.0)], "unseeded": [_run(60.0, 400.0)]}, floors=[15.0])
    rows = _rows(capsys.readouterr().out)
    assert rows["block32"][6:8] == ["1.00x", "1.00x"] and rows["unseeded"][6:8] == ["0.50x", "0.50x"]


@pytest.mark.slow
def test_one_candidate_runs_end_to_end_with_its_floor():
    vllm_python_or_skip()
    command = [
        sys.executable,
        str(BENCHMARKS / "bench_generation.py"),
        "--candidates",
        "block32",
        "--rounds",
        "1",
    ]
    printed = subprocess.run([*command, "--new-tokens", "4"], capture_output=True, text=True, timeout=1200)
    assert printed.returncode == 0, printed.stdout[-3000:] + printed.stderr[-3000:]
    row = _rows(printed.stdout)["block32"]
    assert row[1] == "32" and float(row[4]) > 0 and row[6] == "1.00x"
    assert "floor:" in printed.stdout
