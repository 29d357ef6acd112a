"""tepo.evaluate without a model: benchmark resolution, settings and protocols, metrics, samples file, output dir."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tepo.data import DataError
from tepo.evaluate.benchmarks import (
    BENCHMARKS,
    DATA_DIR_ENV,
    benchmark_path,
    default_data_dir,
    gsm8k_final_answer,
    resolve_benchmark,
)
from tepo.evaluate.metrics import benchmark_metrics, has_final_box
from tepo.evaluate.runner import BenchmarkTask, _prepare_output_dir, results_table
from tepo.evaluate.samples import append_samples, read_samples
from tepo.evaluate.settings import (
    BENCHMARK_INSTRUCTION,
    TEPO_BENCHMARKS,
    EvalError,
    EvalSetting,
    make_setting,
    protocol_settings,
)

SHARED = Path(os.environ.get("TEPO_DATA_DIR", "../shared/data"))  # set by conftest.py
needs_shared = pytest.mark.skipif(
    not (SHARED / "gsm8k" / "test.jsonl").is_file(), reason="shared data not present"
)

# --------------------------------------------------------------------------------------------------------------
# Benchmarks
# --------------------------------------------------------------------------------------------------------------

EXPECTED_ROWS = {
    "math500": 500,
    "aime24": 30,
    "aime25": 30,
    "amc23": 40,
    "minerva": 272,
    "olympiadbench": 675,
    "gsm8k": 1319,
}


@needs_shared
@pytest.mark.parametrize("name", sorted(EXPECTED_ROWS))
def test_every_benchmark_name_resolves_to_the_shared_file(name):
    problems = resolve_benchmark(name, SHARED)
    assert len(problems) == EXPECTED_ROWS[name]
    assert len({p.id for p in problems}) == len(problems)  # resume keys on position and checks the id
    assert all(p.problem and p.answer for p in problems)


@needs_shared
def test_known_first_rows():
    assert resolve_benchmark("gsm8k", SHARED)[0].answer == "18"
    assert resolve_benchmark("aime24", SHARED)[0].answer == "204"
    math500 = resolve_benchmark("math500", SHARED)[0]
    assert math500.id == "test/precalculus/807.json"
    assert math500.answer == "\\left( 3, \\frac{\\pi}{2} \\right)"


@needs_shared
def test_data_dir_env_and_default(monkeypatch, tmp_path):
    monkeypatch.setenv(DATA_DIR_ENV, str(SHARED))
    assert default_data_dir() == SHARED
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "missing"))
    with pytest.raises(DataError, match=DATA_DIR_ENV):
        default_data_dir()
    monkeypatch.delenv(DATA_DIR_ENV)
    monkeypatch.chdir(tmp_path)  # no directory is guessed from the working directory or the machine
    assert default_data_dir() is None


def test_explicit_data_dir_is_used_and_checked(tmp_path):
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").write_text(
        json.dumps({"id": "a", "problem": "1+1?", "answer": 2})
        + "\n"
        + json.dumps({"problem": "2+2?", "answer": "4"})
    )
    problems = resolve_benchmark("gsm8k", tmp_path)
    assert [(p.id, p.answer) for p in problems] == [("a", "2"), ("2", "4")]
    assert benchmark_path("gsm8k", tmp_path) == tmp_path / "gsm8k" / "test.jsonl"
    with pytest.raises(DataError, match="does not exist"):
        resolve_benchmark("gsm8k", tmp_path / "nope")


def test_jsonl_path_and_bad_names(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"problem": "x", "answer": "1"}) + "\n")
    assert resolve_benchmark(str(path))[0].answer == "1"
    with pytest.raises(DataError, match="neither a known name"):
        resolve_benchmark("math5000")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "x", "answer": "1"}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl:1: missing field 'problem'"):
        resolve_benchmark(str(bad))


def test_missing_local_file_without_hub_gives_one_clear_error(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "datasets", None)  # as if the hf-datasets extra were not installed
    with pytest.raises(DataError, match=r"no local file for benchmark 'aime25'.*tepo\[hf-datasets\]"):
        resolve_benchmark("aime25", tmp_path)


def test_hub_answer_transforms():
    assert gsm8k_final_answer("She pays 3 * 4 = <<3*4=12>>12.\n#### 1,234") == "1234"
    with pytest.raises(DataError, match="####"):
        gsm8k_final_answer("no marker")
    amc = BENCHMARKS["amc23"].hub.answer_transform
    assert amc(27.0) == "27" and amc("3.5") == "3.5"
    oly = BENCHMARKS["olympiadbench"].hub.answer_transform
    assert oly(["$2$", "$3$"]) == "$2$, $3$"


# --------------------------------------------------------------------------------------------------------------
# Settings and the TEPO protocol
# --------------------------------------------------------------------------------------------------------------


def test_tepo_protocol_matches_the_paper():
    settings = protocol_settings("tepo", list(TEPO_BENCHMARKS))
    for name in ("aime24", "aime25", "amc23"):
        s = settings[name]
        assert (s.greedy, s.num_samples, s.temperature, s.top_p, s.max_new_tokens) == (
            False,
            32,
            0.6,
            1.0,
            8192,
        )
    # The paper's seven benchmarks: "For AIME and AMC we used temperature 0.6; for the others we used greedy".
    assert set(TEPO_BENCHMARKS) == {
        "math500",
        "aime24",
        "aime25",
        "amc23",
        "omni_math",
        "minerva",
        "olympiadbench",
    }
    for name in ("math500", "omni_math", "minerva", "olympiadbench"):
        s = settings[name]
        assert (s.greedy, s.num_samples, s.max_new_tokens) == (True, 1, 8192)
    assert all(
        s.instruction == BENCHMARK_INSTRUCTION and s.answer_format == "boxed" for s in settings.values()
    )


def test_protocol_overrides_touch_only_what_they_should():
    s = protocol_settings("tepo", ["aime24", "math500"], max_new_tokens=64, num_samples=4, temperature=1.0)
    assert (s["aime24"].num_samples, s["aime24"].temperature, s["aime24"].max_new_tokens) == (4, 1.0, 64)
    assert (s["math500"].greedy, s["math500"].max_new_tokens) == (True, 64)
    with pytest.raises(EvalError, match="unknown protocol"):
        protocol_settings("erpo", ["aime24"])


def test_settings_validation():
    assert make_setting() == EvalSetting()
    assert make_setting(temperature=0.7, num_samples=8).num_samples == 8
    with pytest.raises(EvalError, match="greedy decoding gives one response"):
        make_setting(temperature=0, num_samples=4)
    with pytest.raises(EvalError, match="top_p"):
        make_setting(temperature=1.0, top_p=0)
    with pytest.raises(EvalError, match="answer format"):
        make_setting(answer_format="last")
    with pytest.raises(EvalError, match="temperature > 0"):
        EvalSetting(greedy=False, num_samples=2, temperature=0.0)


# --------------------------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------------------------


def _record(index, statuses, *, boxed=None, tokens=None, truncated=None):
    n = len(statuses)
    boxed = boxed or [False] * n
    tokens = tokens or [10] * n
    truncated = truncated or [False] * n
    return {
        "benchmark": "b",
        "index": index,
        "id": str(index),
        "responses": [
            {"status": s, "boxed": b, "tokens": t, "truncated": tr}
            for s, b, t, tr in zip(statuses, boxed, tokens, truncated)
        ],
    }


def test_sampled_metrics_by_hand():
    # problem 0: 1 of 4 correct; problem 1: 4 of 4; problem 2: 0 of 4.
    records = [
        _record(
            0,
            ["correct", "wrong", "no_answer", "wrong"],
            boxed=[True, True, False, True],
            tokens=[5, 7, 20, 8],
            truncated=[False, False, True, False],
        ),
        _record(1, ["correct"] * 4, boxed=[True] * 4, tokens=[4, 4, 4, 4]),
        _record(
            2,
            ["wrong", "timeout", "wrong", "wrong"],
            boxed=[True, False, True, True],
            tokens=[6, 20, 6, 6],
            truncated=[False, True, False, False],
        ),
    ]
    m = benchmark_metrics(records, greedy=False, pass_k=[1, 2, 4, 8])
    assert m["num_problems"] == 3 and m["samples_per_problem"] == 4
    assert m["avg@4"] == pytest.approx((1 / 4 + 1 + 0) / 3)
    assert m["accuracy"] == m["avg@4"]
    # pass@2 per problem: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5; 1; 0
    assert m["pass@k"]["2"] == pytest.approx((0.5 + 1 + 0) / 3)
    assert m["pass@k"]["4"] == pytest.approx((1 + 1 + 0) / 3)
    assert m["pass@k"]["1"] == pytest.approx(m["avg@4"])
    assert "8" not in m["pass@k"]  # k > n is left out
    assert m["boxed_rate"] == pytest.approx((3 + 4 + 3) / 12)
    assert m["mean_response_tokens"] == pytest.approx((5 + 7 + 20 + 8 + 16 + 6 + 20 + 6 + 6) / 12)
    assert m["truncated_rate"] == pytest.approx(2 / 12)
    assert m["statuses"] == {"correct": 5, "wrong": 5, "no_answer": 1, "timeout": 1}


def test_greedy_metrics_and_errors():
    m = benchmark_metrics([_record(0, ["correct"]), _record(1, ["wrong"])], greedy=True, pass_k=[1, 2])
    assert m["greedy_accuracy"] == 0.5 and "pass@k" not in m
    with pytest.raises(ValueError, match="different numbers of responses"):
        benchmark_metrics([_record(0, ["correct"]), _record(1, ["wrong", "wrong"])], greedy=False)
    assert benchmark_metrics([], greedy=True)["accuracy"] is None


@pytest.mark.parametrize(
    ("text", "boxed"),
    [
        ("so \\boxed{12}.", True),
        ("\\boxed{\\frac{1}{2}} done", True),
        ("the answer is 12", False),
        ("\\boxed{}", False),  # empty: no answer
        ("\\boxed{\\frac{1}{2}", False),  # cut off by the token limit
        ("\\fbox{3}", True),
    ],
)
def test_boxed_rate_counts_complete_final_boxes(text, boxed):
    assert has_final_box(text) is boxed


# --------------------------------------------------------------------------------------------------------------
# samples.jsonl and the output directory
# --------------------------------------------------------------------------------------------------------------


def test_torn_last_line_is_dropped_and_cut(tmp_path):
    path = tmp_path / "samples.jsonl"
    append_samples(path, [_record(0, ["correct"]), _record(1, ["wrong"])])
    with open(path, "a") as handle:
        handle.write('{"benchmark": "b", "index": 2, "id": "2", "respo')
    warnings = []
    records = read_samples(path, warn=warnings.append)
    assert [r["index"] for r in records] == [0, 1]
    assert len(warnings) == 1 and "incomplete last line" in warnings[0]
    append_samples(path, [_record(2, ["correct"])])  # starts on a fresh line
    assert [r["index"] for r in read_samples(path)] == [0, 1, 2]


def test_corrupt_middle_line_is_an_error(tmp_path):
    path = tmp_path / "samples.jsonl"
    append_samples(path, [_record(0, ["correct"])])
    with open(path, "a") as handle:
        handle.write("not json\n")
    append_samples(path, [_record(1, ["correct"])])
    with pytest.raises(EvalError, match=r"samples.jsonl:2: not a sample record"):
        read_samples(path)


def test_output_dir_refuses_mixed_settings_and_models(tmp_path):
    task = BenchmarkTask("gsm8k", [], make_setting(max_new_tokens=16))
    info = {"spec": "embedded", "checkpoint": None}
    _prepare_output_dir(tmp_path, info, [task], overwrite=False)
    _prepare_output_dir(tmp_path, info, [task], overwrite=False)  # same settings: fine (resume)
    other = BenchmarkTask("gsm8k", [], make_setting(max_new_tokens=32))
    with pytest.raises(EvalError, match=r"other settings \(max_new_tokens: 16 -> 32\)"):
        _prepare_output_dir(tmp_path, info, [other], overwrite=False)
    with pytest.raises(EvalError, match="holds an evaluation of model"):
        _prepare_output_dir(
            tmp_path, {"spec": "Qwen/Qwen2.5-0.5B", "checkpoint": None}, [task], overwrite=False
        )
    _prepare_output_dir(tmp_path, info, [other], overwrite=True)
    saved = json.loads((tmp_path / "eval_settings.json").read_text())
    assert saved["benchmarks"]["gsm8k"]["max_new_tokens"] == 32


def test_results_table_shows_headline_and_passk():
    results = {
        "benchmarks": {
            "aime24": {
                "num_problems": 30,
                "samples_per_problem": 4,
                "accuracy": 0.25,
                "pass@k": {"1": 0.25, "4": 0.5},
                "boxed_rate": 0.9,
                "mean_response_tokens": 100.0,
                "truncated_rate": 0.1,
                "settings": {"greedy": False, "temperature": 0.6},
            },
            "math500": {
                "num_problems": 500,
                "samples_per_problem": 1,
                "accuracy": 0.5,
                "boxed_rate": 1.0,
                "mean_response_tokens": 50.0,
                "truncated_rate": 0.0,
                "settings": {"greedy": True},
            },
        }
    }
    table = results_table(results)
    assert "avg@4 T=0.6" in table and "pass@4" in table and "50.0%" in table and "25.0%" in table
    math500_row = [c.strip() for c in table.splitlines()[3].split("|")[1:-1]]
    assert math500_row[:4] == ["math500", "greedy", "500", "50.0%"]
    assert math500_row[4:6] == ["-", "-"]  # no pass@k from one greedy response


@needs_shared
def test_cli_arguments_become_tasks(tmp_path):
    from tepo.cli import build_parser
    from tepo.evaluate.cli import build_tasks

    # The shared benchmarks, and Omni-MATH (not among them) as the hub's rows in a local file: all seven of the
    # protocol come from the data directory, none from the hub.
    data = tmp_path / "data"
    data.mkdir()
    for entry in SHARED.iterdir():
        (data / entry.name).symlink_to(entry.resolve())
    (data / "omni_math").mkdir()
    fixture = Path(__file__).parents[1] / "fixtures" / "hub" / "omni_math.jsonl"
    (data / "omni_math" / "test.jsonl").write_text(fixture.read_text(encoding="utf-8"), encoding="utf-8")
    parser = build_parser()
    args = parser.parse_args(
        [
            "eval",
            "--protocol",
            "tepo",
            "--limit",
            "2",
            "--max-new-tokens",
            "64",
            "--num-samples",
            "4",
            "--data-dir",
            str(data),
        ]
    )
    tasks = {t.name: t for t in build_tasks(args)}
    assert list(tasks) == list(TEPO_BENCHMARKS)
    assert all(len(t.problems) == 2 and t.setting.max_new_tokens == 64 for t in tasks.values())
    assert (tasks["aime24"].setting.num_samples, tasks["aime24"].setting.temperature) == (4, 0.6)
    assert tasks["math500"].setting.greedy and tasks["math500"].source.endswith("math500/test.jsonl")
    omni = tasks["omni_math"]
    assert omni.setting.greedy and Path(omni.source) == (data / "omni_math" / "test.jsonl").resolve()
    assert [p.answer for p in omni.problems] == ["3", "7\\sqrt{2}"]

    args = parser.parse_args(
        [
            "eval",
            "--bench",
            "gsm8k,aime24",
            "--bench",
            "amc23",
            "--temperature",
            "0.7",
            "--num-samples",
            "3",
            "--data-dir",
            str(SHARED),
        ]
    )
    tasks = build_tasks(args)
    assert [t.name for t in tasks] == ["gsm8k", "aime24", "amc23"]
    assert all((t.setting.greedy, t.setting.num_samples) == (False, 3) for t in tasks)
    with pytest.raises(EvalError, match="no benchmark given"):
        build_tasks(parser.parse_args(["eval"]))
    with pytest.raises(EvalError, match="greedy decoding gives one response"):
        build_tasks(parser.parse_args(["eval", "--bench", "gsm8k", "--num-samples", "4"]))
    with pytest.raises(SystemExit):
        parser.parse_args(["eval", "--bench", "gsm8k", "--pass-k", "0,2"])


def test_one_evaluation_at_a_time_per_output_dir(tmp_path):
    from tepo.evaluate import evaluate_benchmarks
    from tepo.evaluate.runner import _lock_output_dir

    task = BenchmarkTask("gsm8k", [], make_setting())
    busy = pytest.raises(EvalError, match=r"another tepo eval \(pid \d+\) is writing to")
    with _lock_output_dir(tmp_path), busy:  # as if another tepo eval were running here
        evaluate_benchmarks(None, None, [task], tmp_path, model_info={"spec": "embedded"}, progress=False)
    report = evaluate_benchmarks(
        None, None, [task], tmp_path, model_info={"spec": "embedded"}, progress=False
    )
    assert report.results["benchmarks"]["gsm8k"]["num_problems"] == 0  # the lock is released again
