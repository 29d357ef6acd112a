"""scripts/paired_runs.py on hand-made runs: where two trajectories part, and the gradient-norm ratio check."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import load_script


def _script():
    return load_script("paired_runs")


def _run(directory: Path, method: str, rows: list[dict], held_out: float) -> None:
    run = directory / method / "seed0"
    run.mkdir(parents=True)
    lines = [json.dumps({"gen_tokens": 100, "no_answer": 0, **row}) for row in rows]
    lines.insert(
        1, json.dumps({"step": 1, "eval_greedy_accuracy": 0.1})
    )  # an eval row: no reward_mean, ignored
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (run / "summary.json").write_text(json.dumps({"after": {"eval_greedy_accuracy": held_out}}))


def test_parting_step_and_scale_deviation(tmp_path, capsys):
    common = {"reward_mean": 0.25}
    _run(
        tmp_path,
        "tepo",
        [
            {"step": 1, "response_length_mean": 40.0, "grad_norm": 0.0, **common},
            {"step": 2, "response_length_mean": 50.0, "grad_norm": 2.0, **common},
            {"step": 3, "response_length_mean": 30.0, "grad_norm": 1.0, **common},
        ],
        held_out=0.5,
    )
    _run(
        tmp_path,
        "luspo",
        [
            {"step": 1, "response_length_mean": 40.0, "grad_norm": 0.0, **common},
            # 101 / (2 * 50) - 1 = 0.01: the deviation the table reports
            {"step": 2, "response_length_mean": 50.0, "grad_norm": 101.0, **common},
            {"step": 3, "response_length_mean": 31.0, "grad_norm": 7.0, **common},  # parted: not compared
        ],
        held_out=0.25,
    )
    assert _script().main([str(tmp_path), "tepo", "luspo", "--scale", "response_length_mean"]) == 0
    row = capsys.readouterr().out.splitlines()[2]
    assert row == "| 0 | 2 | 3 | 1 | 0.01 | 0.500 | 0.250 | -0.250 |"


def test_never_parted_and_no_shared_seed(tmp_path, capsys):
    rows = [{"step": 1, "response_length_mean": 40.0, "reward_mean": 0.0, "grad_norm": 1.0}]
    _run(tmp_path, "a", rows, held_out=0.5)
    _run(tmp_path, "b", rows, held_out=0.5)
    assert _script().main([str(tmp_path), "a", "b"]) == 0
    assert capsys.readouterr().out.splitlines()[2] == "| 0 | 1 | never | 0 | - | 0.500 | 0.500 | +0.000 |"
    # equal norms at --scale 1: deviation 0; at --scale 2: |1/2 - 1| = 0.5
    assert _script().main([str(tmp_path), "a", "b", "--scale", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[2] == "| 0 | 1 | never | 1 | 0 | 0.500 | 0.500 | +0.000 |"
    assert _script().main([str(tmp_path), "a", "b", "--scale", "2"]) == 0
    assert capsys.readouterr().out.splitlines()[2] == "| 0 | 1 | never | 1 | 0.5 | 0.500 | 0.500 | +0.000 |"
    assert _script().main([str(tmp_path), "a", "missing"]) == 2
    assert "no seed finished by both" in capsys.readouterr().err
