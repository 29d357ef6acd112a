"""scripts/compare_run_values.py: two runs are the same run when every non-timing value is equal, whichever
spelling (flat or grouped) their metrics logs use."""

from __future__ import annotations

import json

from helpers import load_script


def _run(path, rows, summary):
    path.mkdir()
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "summary.json").write_text(json.dumps(summary))
    return path


FLAT = [{"step": 1, "loss": 0.25, "reward_mean": 0.5, "update_seconds": 3.0, "peak_memory_mb": 900.0}]
GROUPED = [
    {
        "step": 1,
        "update/loss": 0.25,
        "reward/mean": 0.5,
        "time/update_seconds": 9.0,
        "memory/peak_rss_mb": 1.0,
    }
]
SUMMARY = {"before": {"eval_greedy_accuracy": 0.25}, "after": {"eval_greedy_accuracy": 0.5, "seconds": 1.0}}


def test_an_old_flat_log_and_a_grouped_one_with_the_same_values_are_the_same_run(tmp_path, capsys):
    script = load_script("compare_run_values")
    before = _run(tmp_path / "before", FLAT, SUMMARY)
    after = _run(
        tmp_path / "after", GROUPED, SUMMARY | {"after": {"eval_greedy_accuracy": 0.5, "seconds": 7.0}}
    )
    assert script.main([str(before), str(after)]) == 0
    assert "compared 5 values, 0 differ" in capsys.readouterr().out  # step, loss, reward, 2 held-out scores


def test_one_value_apart_is_named_and_fails(tmp_path, capsys):
    script = load_script("compare_run_values")
    before = _run(tmp_path / "before", FLAT, SUMMARY)
    after = _run(tmp_path / "after", [GROUPED[0] | {"update/loss": 0.2500001}], SUMMARY)
    assert script.main([str(before), str(after)]) == 1
    out = capsys.readouterr().out
    assert "step 1: update/loss: 0.25 != 0.2500001" in out and "1 differ" in out


def test_without_eval_compares_the_steps_only(tmp_path, capsys):
    script = load_script("compare_run_values")
    before = _run(tmp_path / "before", [FLAT[0] | {"eval_greedy_accuracy": 0.5}], SUMMARY)
    after = _run(tmp_path / "after", GROUPED, {"before": {}, "after": {}})  # made with eval.size=0
    assert script.main([str(before), str(after), "--without-eval"]) == 0
    assert "compared 3 values, 0 differ" in capsys.readouterr().out  # step, loss, reward
    assert script.main([str(before), str(after)]) == 1  # the held-out values are missing
