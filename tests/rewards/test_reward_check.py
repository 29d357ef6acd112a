"""``tepo reward check``: a reward function of the user's scored on data rows with no model, in the real
sandboxed workers: each row's reward or its failure with the reason, a summary, and an exit status that says
whether every call scored."""

from __future__ import annotations

import json

import pytest

from tepo.cli import main

REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "crash":
        raise ValueError("boom from my reward")
    return float(solution_str.strip() == ground_truth) + len(extra_info["topic"]) / 100


def batched(prompts, completions, ground_truth, **kwargs):
    return [len(c) for c in completions]
"""


@pytest.fixture
def files(tmp_path):
    (tmp_path / "reward.py").write_text(REWARD)
    rows = [{"id": f"r{i}", "problem": f"say {i}", "answer": str(i), "topic": "ab"} for i in range(3)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_each_row_scores_its_answer_by_default_and_the_summary_counts(files, capsys):
    code = main(
        ["reward", "check", f"{files / 'reward.py'}:compute_score", "--data", str(files / "rows.jsonl")]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "3 rows; responses: each row's answer" in out
    assert "row 1 (r0): 1.02" in out and "row 3 (r2): 1.02" in out
    assert "compute_score: 3 of 3 scored, mean 1.02; 0 errors, 0 timeouts" in out


def test_given_responses_a_failure_shows_its_reason_and_the_exit_status_is_1(files, capsys):
    (files / "responses.jsonl").write_text('"0"\n{"response": "crash"}\n{"text": "abc"}\n')
    argv = ["reward", "check", f"{files / 'reward.py'}:compute_score", f"len={files / 'reward.py'}:batched"]
    code = main([*argv, "--data", str(files / "rows.jsonl"), "--responses", str(files / "responses.jsonl")])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "row 1 (r0): compute_score 1.02; len 1" in out
    assert (
        "row 2 (r1): compute_score error: raised ValueError: boom from my reward (reward.py line 4); len 5"
        in out
    )
    assert "compute_score: 2 of 3 scored, mean 0.52; 1 errors, 0 timeouts" in out
    assert "len: 3 of 3 scored, mean 3; 0 errors, 0 timeouts" in out


def test_a_missing_function_or_too_few_responses_is_one_line_and_exit_2(files, capsys):
    data = ["--data", str(files / "rows.jsonl")]
    assert main(["reward", "check", f"{files / 'reward.py'}:compute_scor", *data]) == 2
    err = capsys.readouterr().err
    assert "has no function 'compute_scor' (its functions: batched, compute_score)" in err
    (files / "short.jsonl").write_text('"1"\n')
    argv = [
        "reward",
        "check",
        f"{files / 'reward.py'}:compute_score",
        *data,
        "--responses",
        str(files / "short.jsonl"),
    ]
    assert main(argv) == 2
    assert "short.jsonl: 1 responses for 3 data rows; expected one per row" in capsys.readouterr().err
