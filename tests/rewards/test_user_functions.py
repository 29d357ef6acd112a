"""Reward functions of the user's own (``reward.functions`` entries with a ``path``): verl's and TRL's forms
told apart by parameter names, called in the real sandboxed worker pool with the data a row gives, and a
function that raises, returns a non-number or hangs costing its own responses only (scored 0 and counted),
in bounded time. The files are real Python files written here and imported by the workers themselves."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tepo.data import Problem
from tepo.rewards import RewardPool, score_responses
from tepo.rewards.user_functions import RewardFunctionError, function_kind, load_function

VERL_FILE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    # every argument shows in the value: len(solution) + 10 * len(extra_info) + 100 * (source) + answer
    return len(solution_str) + 10 * len(extra_info) + 100 * (data_source == "ds") + float(ground_truth)


def as_dict(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": 0.5, "acc": True}  # verl's dict form: its "score" is the reward


def raises(data_source, solution_str, ground_truth, extra_info=None):
    if "x" in solution_str:
        raise ValueError("boom")
    return 1.0


def not_a_number(data_source, solution_str, ground_truth, extra_info=None):
    return {"a": "nope", "b": float("nan"), "c": {"acc": 1}}.get(solution_str, 1.0)


def sleeps(data_source, solution_str, ground_truth, extra_info=None):
    import time

    if "x" in solution_str:
        time.sleep(60)
    return 1.0


def spins(data_source, solution_str, ground_truth, extra_info=None):
    # swallows the worker's soft timeout: only the hard deadline (a killed worker) ends it
    while "x" in solution_str:
        try:
            while True:
                pass
        except BaseException:
            pass
    return 1.0


def reads_stdin(data_source, solution_str, ground_truth, extra_info=None):
    import sys

    return float(len(sys.stdin.read()))  # the protocol's pipe is not the function's stdin
"""

TRL_FILE = """
import time


def lengths(prompts, completions, ground_truth, topic, **kwargs):
    # len(completion) + 100 * (prompt is the problem text) + 10 * int(answer) + 1000 * (topic column present)
    return [
        len(c) + 100 * (p == "question 1") + 10 * int(g) + 1000 * (t == "cats")
        for p, c, g, t in zip(prompts, completions, ground_truth, topic)
    ]


def partly_bad(prompts, completions, **kwargs):
    return [{"x": "bad", "n": None}.get(c, 2.0) for c in completions]


def wrong_length(prompts, completions, **kwargs):
    return [1.0]


def hangs_on_x(prompts, completions, **kwargs):
    if any("x" in c for c in completions):
        time.sleep(60)
    return [1.0] * len(completions)
"""

TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("user-rewards")
    (root / "verl_rewards.py").write_text(VERL_FILE)
    (root / "trl_rewards.py").write_text(TRL_FILE)
    return {"verl": root / "verl_rewards.py", "trl": root / "trl_rewards.py"}


@pytest.fixture(scope="module")
def pool(files):
    names = {"verl": ["compute_score", "as_dict", "raises", "not_a_number", "sleeps", "spins", "reads_stdin"]}
    names["trl"] = ["lengths", "partly_bad", "wrong_length", "hangs_on_x"]
    functions = [
        {"label": name, "path": str(files[form]), "name": name} for form in names for name in names[form]
    ]
    with RewardPool(num_workers=2, timeout_s=TIMEOUT_S, functions=functions) as p:
        yield p


def problem(i: int, **fields) -> Problem:
    return Problem(id=f"p{i}", problem=f"question {i}", answer="3", **fields)


def test_forms_are_told_apart_by_parameter_names(pool):
    kinds = pool.function_kinds
    assert {kinds[n] for n in ("compute_score", "as_dict", "raises", "sleeps")} == {"verl"}
    assert {kinds[n] for n in ("lengths", "partly_bad", "hangs_on_x")} == {"trl"}


def test_verl_form_gets_the_row_and_returns_its_number_or_dict_score(pool):
    p = problem(1, data_source="ds", extra_info={"k": 1, "j": [2]})
    texts = ["ab<|im_end|>", "abcd"]  # the trailer is dropped, as for math-verify
    got = score_responses(pool, ["compute_score", "as_dict"], texts, [p], 2)
    assert got.columns == [[2 + 20 + 100 + 3.0, 4 + 20 + 100 + 3.0], [0.5, 0.5]]
    assert got.errors == {"compute_score": 0, "as_dict": 0} and got.timeouts == {
        "compute_score": 0,
        "as_dict": 0,
    }
    assert got.verdicts is None  # only the user's functions, no correctness: math-verify is not run


def test_trl_form_gets_a_group_with_prompts_answers_and_row_columns(pool):
    problems = [problem(1, extra_info={"topic": "cats"}), problem(2, extra_info={"topic": "rain"})]
    got = score_responses(pool, ["correctness", "lengths"], ["3", "a", "bb", r"\boxed{3}"], problems, 2)
    assert got.columns[0] == [1.0, 0.0, 0.0, 1.0]  # correctness listed: math-verify runs beside
    assert got.columns[1] == [1 + 100 + 30 + 1000, 1 + 100 + 30 + 1000, 2 + 30, 9 + 30]


def test_a_raising_or_non_number_function_scores_zero_for_that_response_only_and_counts(pool):
    texts = ["ok", "x", "a", "b", "c", "fine"]
    got = score_responses(pool, ["raises", "not_a_number"], texts, [problem(i) for i in range(3)], 2)
    assert got.columns == [[1.0, 0.0, 1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0, 0.0, 1.0]]
    assert got.errors == {"raises": 1, "not_a_number": 3}  # a string, NaN, a dict without "score"
    assert got.timeouts == {"raises": 0, "not_a_number": 0}


def test_trl_elements_that_are_not_numbers_count_none_does_not_and_a_wrong_length_fails_the_group(pool):
    got = score_responses(
        pool, ["partly_bad", "wrong_length"], ["x", "n", "y", "z"], [problem(0), problem(1)], 2
    )
    assert got.columns == [[0.0, 0.0, 2.0, 2.0], [0.0] * 4]
    assert got.errors == {"partly_bad": 1, "wrong_length": 4}


def test_a_hanging_function_times_out_scores_zero_and_the_pool_goes_on(pool):
    before = pool.stats
    start = time.perf_counter()
    got = score_responses(pool, ["sleeps", "spins"], ["x", "ok", "x", "ok"], [problem(0), problem(1)], 2)
    elapsed = time.perf_counter() - start
    assert got.columns == [[0.0, 1.0, 0.0, 1.0], [0.0, 1.0, 0.0, 1.0]]
    assert got.timeouts == {"sleeps": 2, "spins": 2} and got.errors == {"sleeps": 0, "spins": 0}
    # 4 hanging calls on 2 workers: two rounds of at most the hard deadline, plus a worker start-up each. The
    # bound only tells "returned" from "hung" (a hang never returns): generous, since a loaded machine took 28 s.
    assert elapsed < 4 * TIMEOUT_S + 120, elapsed
    after = pool.stats
    assert after.call_timeouts - before.call_timeouts == 4
    assert after.hard_timeouts - before.hard_timeouts >= 2  # "spins" survives the soft deadline: killed
    assert after.timeouts == before.timeouts  # the math-verify counters are not the user's functions'
    again = score_responses(pool, ["sleeps"], ["ok", "ok"], [problem(0)], 2)
    assert again.columns == [[1.0, 1.0]]


def test_a_trl_group_that_hangs_scores_zero_for_the_whole_group(pool):
    got = score_responses(pool, ["hangs_on_x"], ["a", "x", "b", "c"], [problem(0), problem(1)], 2)
    assert got.columns == [[0.0, 0.0, 1.0, 1.0]] and got.timeouts == {"hangs_on_x": 2}


def test_a_function_reading_stdin_reads_nothing_and_the_protocol_survives(pool):
    got = score_responses(pool, ["reads_stdin", "compute_score"], ["a", "b"], [problem(0)], 2)
    assert got.columns == [[0.0, 0.0], [4.0, 4.0]] and got.errors["reads_stdin"] == 0


def test_a_module_name_loads_like_a_file(files, monkeypatch):
    monkeypatch.syspath_prepend(str(files["trl"].parent))
    assert function_kind(load_function("trl_rewards", "lengths")) == "trl"


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def f(data_source, solution_str, ground_truth, extra_info=None): return 1", None),
        ("def f(solution_str, ground_truth, **kw): return 1", None),
        ("def f(prompts, completions, **kwargs): return []", None),
        ("def f(completions, prompts): return []", None),
        ("def f(x, y): return 1", "its parameters (x, y) fit neither form"),
        ("def f(solution_str, tokenizer): return 1", "parameter 'tokenizer' cannot be given by keyword"),
        ("def f(solution_str, /): return 1", "parameter 'solution_str' cannot be given by keyword"),
        ("f = 3", "'f' is a int, not a function"),
        ("def g(solution_str): return 1", "has no function 'f'"),
        ("def f(solution_str):\n  return (", "syntax error in"),
        ("raise ImportError('needs a package')", "failed: ImportError: needs a package"),
    ],
)
def test_signatures_and_files_accepted_or_refused_in_one_line(tmp_path, source, message):
    path = tmp_path / "r.py"
    path.write_text(source)
    if message is None:
        assert function_kind(load_function(str(path), "f")) in ("verl", "trl")
        return
    with pytest.raises(RewardFunctionError) as err:
        function_kind(load_function(str(path), "f"))
    assert message in str(err.value) and "\n" not in str(err.value)
