"""benchmarks/bench_vllm_batching.py at a toy size on GSM8K: both parts run and the table compares them (slow: three
vLLM engines)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import vllm_python_or_skip

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.slow
def test_a_tiny_run_compares_prefill_modes_and_evaluation_calls():
    vllm_python_or_skip()
    data = os.environ.get("TEPO_DATA_DIR")
    if not data or not (Path(data) / "gsm8k" / "train.jsonl").is_file():
        pytest.skip("needs $TEPO_DATA_DIR with gsm8k/")
    size = ["--prompts", "2", "--samples", "2", "--new-tokens", "4", "--eval-problems", "4", "--rounds", "1"]
    command = [sys.executable, str(BENCHMARKS / "bench_vllm_batching.py"), *size]
    printed = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    assert printed.returncode == 0, printed.stdout[-3000:] + printed.stderr[-3000:]
    rows = [line for line in printed.stdout.splitlines() if line.startswith("| ") and "measurement" not in line]
    assert len(rows) == 2 and "chunked prefill on (A) vs off (B)" in rows[0] and "4 problems" in rows[1]
