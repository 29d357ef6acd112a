"""benchmarks/bench_precision.py: the table says whether `auto` picked the faster precision, and the report files
carry the table with how it was made; one tiny run end to end (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

PICKS = {"model.autocast_bf16": True, "rollout.autocast_bf16": False, "rollout.vllm.dtype": "bfloat16"}
RESULTS = {
    "forward_backward": {"float32": 100.0, "bf16": 250.0},
    "hf_generate": {"float32": 300.0, "bf16": 150.0},
}


def test_the_table_says_whether_auto_picked_the_faster_precision():
    from bench_precision import table

    lines = table(RESULTS, PICKS).splitlines()
    assert lines[2] == "| forward+backward (update) | 100 | 250 | 2.50 | bf16 | True (bf16) | yes |"
    assert lines[3] == "| HF generate | 300 | 150 | 0.50 | float32 | False (float32) | yes |"
    assert lines[4] == "| vLLM generate | - | - | - | - | bfloat16 | not measured |"


def test_the_report_files_hold_the_table_and_how_it_was_made(tmp_path):
    from bench_precision import build_parser, table, write_report

    from tepo.precision import resolve_precision

    args = build_parser().parse_args(["--rounds", "2", "--skip-vllm"])
    machine = {"cpu_model": "Test CPU", "cpu_flags": ["avx2", "avx512_bf16"]}
    precision, _ = resolve_precision("auto", "auto", "auto", "cpu")
    text = table(RESULTS, PICKS)
    write_report(
        tmp_path,
        args,
        "python benchmarks/bench_precision.py --rounds 2",
        machine,
        precision,
        PICKS,
        RESULTS,
        text,
    )
    (md,) = tmp_path.glob("*.md")
    assert md.stem.endswith("avx512-bf16") and md.with_suffix(".json").exists()
    assert text in md.read_text() and "--rounds 2" in md.read_text() and "medians of 2" in md.read_text()
    saved = json.loads(md.with_suffix(".json").read_text())
    assert saved["results"] == RESULTS and saved["picks"] == PICKS and saved["args"] == vars(args)
    assert isinstance(args, Namespace)


@pytest.mark.slow
def test_a_tiny_run_writes_its_report(tmp_path):
    size = [
        "--rounds",
        "1",
        "--rows",
        "1",
        "--tokens",
        "8",
        "--prompts",
        "1",
        "--samples",
        "1",
        "--new-tokens",
        "2",
    ]
    command = [
        sys.executable,
        str(BENCHMARKS / "bench_precision.py"),
        *size,
        "--skip-vllm",
        "--out",
        str(tmp_path),
    ]
    printed = subprocess.run(command, capture_output=True, text=True, timeout=1200)
    assert printed.returncode == 0, printed.stdout[-3000:] + printed.stderr[-3000:]
    (md,) = tmp_path.glob("*.md")
    assert "| forward+backward (update) |" in md.read_text() and "vLLM generate | - |" in md.read_text()
