"""A reward function of the user's that fails is loud (``tepo.rewards.failures``): its first failure is one
console line with the reason and the response's index, every failure is a row of the failures file, its prints
are in its worker's log in the given folder, and a function that failed on its whole batch stops the caller
with ``RewardFunctionsFailing``. Real files imported by real sandboxed workers."""

from __future__ import annotations

import json

import pytest

from tepo.data import Problem
from tepo.rewards import RewardFailures, RewardFunctionsFailing, RewardPool, score_responses

FILE = """
def raises(data_source, solution_str, ground_truth, extra_info=None):
    print("my reward saw", solution_str)
    if "bad" in solution_str:
        raise ValueError("boom from my reward")
    return 1.0


def returns_text(data_source, solution_str, ground_truth, extra_info=None):
    return "one"


def batched(prompts, completions, **kwargs):
    return [1.0 if "bad" not in c else "no" for c in completions]
"""
TEXTS = ["good", "bad one", "good", "good"]
PROBLEMS = [Problem(id="p", problem="p", answer="1", data_source="ds", extra_info={}) for _ in range(2)]


@pytest.fixture(scope="module")
def reward_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("rewards") / "my_rewards.py"
    path.write_text(FILE)
    return path


def _pool(path, log_dir, failures, *names):
    functions = [{"label": name, "path": str(path), "name": name} for name in names]
    return RewardPool(num_workers=1, timeout_s=10.0, functions=functions, log_dir=log_dir, failures=failures)


def test_a_raising_function_warns_once_with_its_message_and_writes_every_failure(tmp_path, reward_file):
    lines = []
    failures = RewardFailures(tmp_path / "reward_failures.jsonl", log=lines.append)
    with _pool(reward_file, tmp_path, failures, "raises", "batched") as pool:
        scored = score_responses(pool, ["raises", "batched"], TEXTS, PROBLEMS, 2, step=3)
        score_responses(pool, ["raises", "batched"], TEXTS, PROBLEMS, 2, step=4)
    assert scored.columns == [[1.0, 0.0, 1.0, 1.0], [1.0, 0.0, 1.0, 1.0]]
    assert scored.statuses["raises"] == ["scored", "error", "scored", "scored"]
    # one warning per function, on its first failure: the exception's type, message and line, and the index
    assert len(lines) == 2, lines
    assert "'raises' failed on response 1 in step 3" in lines[0]
    assert "raised ValueError: boom from my reward (my_rewards.py line 5)" in lines[0]
    assert (
        "'batched' failed on response 1 in step 3" in lines[1]
        and "returned str, expected a number" in lines[1]
    )
    rows = [json.loads(line) for line in (tmp_path / "reward_failures.jsonl").read_text().splitlines()]
    assert [(r["step"], r["function"], r["index"], r["status"]) for r in rows] == [
        (3, "raises", 1, "error"),
        (3, "batched", 1, "error"),
        (4, "raises", 1, "error"),
        (4, "batched", 1, "error"),
    ]
    assert rows[0]["response"] == "bad one" and "boom from my reward" in rows[0]["detail"]
    # the worker's prints and the traceback are in its log in the given folder
    log = (tmp_path / "reward_worker_0.log").read_text()
    assert "my reward saw bad one" in log and "ValueError: boom from my reward" in log


def test_a_function_that_failed_on_its_whole_batch_stops_with_its_reason(tmp_path, reward_file):
    failures = RewardFailures(tmp_path / "f.jsonl", log=lambda _: None, resume_hint="resume it")
    with (
        _pool(reward_file, None, failures, "returns_text") as pool,
        pytest.raises(RewardFunctionsFailing) as caught,
    ):
        score_responses(pool, ["returns_text"], TEXTS, PROBLEMS, 2, step=1)
    message = str(caught.value)
    assert "'returns_text' failed on 4 of its 4 responses in step 1" in message
    assert "returned str, expected a number" in message and "f.jsonl" in message
    assert "tepo reward check" in message and message.endswith("; resume it")
    assert len((tmp_path / "f.jsonl").read_text().splitlines()) == 4


@pytest.mark.parametrize(("share", "stops"), [(None, False), (0.5, False), (0.25, True)])
def test_the_stop_share_is_the_share_of_failed_responses_at_which_it_stops(
    tmp_path, reward_file, share, stops
):
    failures = RewardFailures(None, stop_share=share, log=lambda _: None)
    with _pool(reward_file, None, failures, "raises") as pool:
        if stops:  # 1 of 4 failed
            with pytest.raises(RewardFunctionsFailing, match="failed on 1 of its 4"):
                score_responses(pool, ["raises"], TEXTS, PROBLEMS, 2)
        else:
            assert score_responses(pool, ["raises"], TEXTS, PROBLEMS, 2).errors == {"raises": 1}
    assert failures.failed == {"raises": 1}
