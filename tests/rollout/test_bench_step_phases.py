"""benchmarks/bench_step_phases.py (issue #54) runs real default steps with the vLLM engine's pieces timed apart: a
short run must print one row per step whose phases add up (it once failed on a metric the step no longer returns)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from helpers import vllm_python_or_skip

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

pytestmark = pytest.mark.model


def _rows(printed: str) -> list[dict[str, float]]:
    lines = [line for line in printed.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    return [dict(zip(header, map(float, line.strip("|").split("|")))) for line in lines[1:]]


@pytest.mark.slow  # 38 s alone on 2 cores (model, engine, reward workers, two guarded syncs): opt-in, -m slow
def test_two_small_steps_print_their_phases_and_the_second_has_a_sync(capsys, monkeypatch):
    python = vllm_python_or_skip()
    monkeypatch.setenv("TEPO_VLLM_PYTHON", python)
    from bench_step_phases import main

    main(["rollout.backend=vllm", "rollout.group_size=2", "train.prompts_per_step=2", "rollout.max_new_tokens=8",
          "--steps", "2"])  # fmt: skip
    first, second = _rows(capsys.readouterr().out)
    assert [first["step"], second["step"]] == [1, 2]
    for row in (first, second):
        assert row["tokens"] > 0 and row["engine generate"] > 0 and row["update"] > 0
        assert row["step s"] >= row["generation"] + row["update"] - 0.01
    assert first["sync"] == 0 and second["sync"] > 0 and second["engine reload"] > 0
    assert second["parity check"] > 0  # the guard checks the first two syncs
