"""tepo.metrics: the JSONL log survives kills (torn last line), is cut back on resume without losing rows, never
holds a step twice, and stays valid JSON when a value is NaN/inf."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tepo.metrics import MetricsLog, read_metrics, truncate_metrics
from tepo.metrics import log as metrics


def _strict(line: str) -> dict:
    """json.loads that refuses NaN/Infinity, which are not JSON (other tools reading the log would choke)."""

    def refuse(name):
        raise ValueError(f"non-JSON constant {name}")

    return json.loads(line, parse_constant=refuse)


def _lines(path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_rows_round_trip_with_nonfinite_values_as_strings(tmp_path):
    log = MetricsLog(tmp_path)
    log.append(
        {
            "step": 1,
            "update/loss": 0.5,
            "update/grad_norm": float("nan"),
            "update/lr": torch.tensor(2e-5),
            "note": "x",
        }
    )
    log.append({"step": 2, "update/loss": float("inf"), "update/grad_norm": float("-inf")})
    log.close()
    rows = [_strict(line) for line in _lines(tmp_path / "metrics.jsonl")]
    # Written as given (the phases name their metrics in their groups: tepo.metrics.names).
    assert rows[0] == {
        "step": 1,
        "update/loss": 0.5,
        "update/grad_norm": "nan",
        "update/lr": pytest.approx(2e-5),
        "note": "x",
    }
    assert rows[1] == {"step": 2, "update/loss": "inf", "update/grad_norm": "-inf"}
    assert read_metrics(tmp_path / "metrics.jsonl") == rows


def test_each_row_is_fsynced_before_append_returns(tmp_path, monkeypatch):
    synced = []
    real = metrics.os.fsync
    monkeypatch.setattr(metrics.os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    log = MetricsLog(tmp_path)
    for step in (1, 2, 3):
        log.append({"step": step})
    assert len(synced) == 3


def test_torn_last_line_is_ignored_by_readers(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "loss": 0.9}\n{"step": 3, "lo')
    assert read_metrics(path) == [{"step": 1, "update/loss": 1.0}, {"step": 2, "update/loss": 0.9}]
    assert read_metrics(tmp_path / "absent.jsonl") == []


def test_reopening_after_a_torn_write_starts_the_next_row_on_its_own_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "lo')  # killed inside the write of step 2
    log = MetricsLog(tmp_path)
    log.append({"step": 2, "update/loss": 0.5})
    assert _lines(path) == ['{"step": 1}', '{"step": 2, "update/loss": 0.5}']
    path.write_text('{"st')  # the only line is torn
    MetricsLog(tmp_path).append({"step": 1})
    assert _lines(path) == ['{"step": 1}']


def test_truncate_moves_later_rows_to_the_rolledback_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "v": s}) + "\n" for s in range(1, 6)) + '{"step": 6, "v"')
    moved = truncate_metrics(tmp_path, 3)
    assert moved == 2
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3]
    rolled = read_metrics(tmp_path / "metrics.rolledback.jsonl")
    assert [r["step"] for r in rolled] == [4, 5]  # kept, not deleted; the torn fragment is dropped
    assert not (tmp_path / "metrics.jsonl.tmp").exists()
    # A second roll-back appends to the same file.
    assert truncate_metrics(tmp_path, 1) == 2
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.rolledback.jsonl")] == [4, 5, 2, 3]
    assert truncate_metrics(tmp_path / "nowhere", 1) == 0


def test_truncate_to_a_later_step_keeps_everything(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n')
    assert truncate_metrics(tmp_path, 10) == 0
    assert _lines(path) == ['{"step": 1}', '{"step": 2}']
    assert not (tmp_path / "metrics.rolledback.jsonl").exists()


def test_appending_a_step_already_logged_rolls_back_the_old_rows(tmp_path):
    """A run killed after logging steps 1-2 but before its first checkpoint restarts at step 0 (nothing to
    restore, nothing truncated): the redone step 1 must replace the old rows, not follow them."""
    first = MetricsLog(tmp_path)
    first.append({"step": 1, "v": "old"})
    first.append({"step": 2, "v": "old"})
    again = MetricsLog(tmp_path)
    again.append({"step": 1, "v": "new"})
    again.append({"step": 2, "v": "new"})
    again.append({"step": 3, "v": "new"})
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["v"]) for r in rows] == [(1, "new"), (2, "new"), (3, "new")]
    rolled = read_metrics(tmp_path / "metrics.rolledback.jsonl")
    assert [(r["step"], r["v"]) for r in rolled] == [(1, "old"), (2, "old")]


def test_rows_without_a_step_are_appended_as_they_are(tmp_path):
    log = MetricsLog(tmp_path)
    log.append({"event": "start"})
    log.append({"step": 1, "loss": math.pi})
    assert read_metrics(tmp_path / "metrics.jsonl") == [
        {"event": "start"},
        {"step": 1, "update/loss": math.pi},
    ]
