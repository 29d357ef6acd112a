"""tepo.data: procedural tasks (correct, deterministic, train/test disjoint), file loading, the prompt stream's
order and its saved position."""

from __future__ import annotations

import json
import re

import pytest

from tepo.data import (
    DataError,
    Problem,
    PromptStream,
    load_problems,
    make_arithmetic_problems,
)

SINGLE_ADD = re.compile(r"has (\d+) \w+ and gets (\d+) more")
SINGLE_MUL = re.compile(r"has (\d+) \w+ with (\d+) \w+ in each")


@pytest.mark.parametrize("task", ["arithmetic", "arithmetic-multistep"])
def test_procedural_train_and_test_are_disjoint_and_deterministic(task):
    train = load_problems(task, split="train", limit=300, seed=4)
    test = load_problems(task, split="test", limit=100, seed=4)
    assert len(train) == 300 and len(test) == 100
    assert not {p.problem for p in train} & {p.problem for p in test}
    assert len({p.problem for p in train}) == 300, "a training problem repeats"
    assert load_problems(task, split="train", limit=300, seed=4) == train
    assert load_problems(task, split="test", limit=100, seed=4) == test
    assert load_problems(task, split="train", limit=300, seed=5) != train
    # A prefix of a longer draw is the shorter draw: eval.size / data.limit do not reshuffle problems.
    assert load_problems(task, split="test", limit=50, seed=4) == test[:50]


def test_single_step_answers_are_right():
    problems = make_arithmetic_problems("arithmetic", 200, seed=1)
    checked = 0
    for p in problems:
        if m := SINGLE_ADD.search(p.problem):
            assert int(p.answer) == int(m[1]) + int(m[2]), p
        elif m := SINGLE_MUL.search(p.problem):
            assert int(p.answer) == int(m[1]) * int(m[2]), p
        else:
            pytest.fail(f"unrecognised problem text: {p.problem}")
        checked += 1
    assert checked == 200


def test_multistep_answers_are_right():
    for p in make_arithmetic_problems("arithmetic-multistep", 200, seed=2):
        numbers = [int(n) for n in re.findall(r"\d+", p.problem)]
        if "gives away" in p.problem:
            a, b, c = numbers
            assert int(p.answer) == a * b - c
        elif "found" in p.problem:
            a, b, c, ten = numbers
            assert ten == 10 and int(p.answer) == a + b + 10 * c
        else:
            a, b = numbers
            assert int(p.answer) == a + (a + b)


def test_jsonl_loading_maps_fields_ids_numbers_bom_and_blank_lines(tmp_path):
    path = tmp_path / "d.jsonl"
    rows = [
        {"question": "  What is 2+2? ", "target": 4, "uid": "q1"},
        {"question": "Half of 3?", "target": 1.5},
        {"question": "Name?", "target": " \\frac{1}{2} ", "extra": [1, 2]},
    ]
    text = "\n".join(json.dumps(r) for r in rows[:2]) + "\r\n\n   \n" + json.dumps(rows[2]) + "\n"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    problems = load_problems(str(path), problem_field="question", answer_field="target", id_field="uid")
    assert problems == [  # data_source: the file's name, as no row names its own
        Problem(id="q1", problem="What is 2+2?", answer="4", data_source="d"),
        Problem(id="2", problem="Half of 3?", answer="1.5", data_source="d"),
        Problem(id="5", problem="Name?", answer="\\frac{1}{2}", data_source="d"),  # id: the line number
    ]
    # extra_info (for reward functions of the user's own): the fields but the problem and the answer
    assert [p.extra_info for p in problems] == [{"uid": "q1"}, {}, {"extra": [1, 2]}]
    assert load_problems(str(path), problem_field="question", answer_field="target", limit=2) == [
        Problem(id="1", problem="What is 2+2?", answer="4", data_source="d"),
        Problem(id="2", problem="Half of 3?", answer="1.5", data_source="d"),
    ]


def test_rows_give_reward_functions_verl_s_data_source_and_extra_info(tmp_path):
    """A row in verl's layout keeps its own data_source and its extra_info mapping merged with its other
    fields; a value that is not JSON reaches reward functions as its str."""
    import datetime

    from tepo.data.loading import row_extra_info

    path = tmp_path / "v.jsonl"
    row = {"problem": "p", "answer": "7", "data_source": "openai/gsm8k", "ability": "math"}
    path.write_text(json.dumps({**row, "extra_info": {"split": "train", "index": 3}}) + "\n")
    (problem,) = load_problems(str(path))
    assert problem.data_source == "openai/gsm8k"
    assert problem.extra_info == {"ability": "math", "split": "train", "index": 3}
    when = datetime.date(2026, 1, 2)
    assert row_extra_info({"problem": "p", "when": when, "n": 1}, ("problem",)) == {
        "when": "2026-01-02",
        "n": 1,
    }
    assert load_problems("arithmetic", limit=1)[0].data_source == "arithmetic"


def test_parquet_loading_and_row_errors(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"problem": ["1+1", "2+3"], "answer": ["2", "5"]}), good)
    assert [p.answer for p in load_problems(str(good))] == ["2", "5"]
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"problem": ["1+1", "2+3"], "answer": ["2", ""]}), bad)
    with pytest.raises(DataError, match=r"bad\.parquet: row 2: field 'answer' is empty"):
        load_problems(str(bad))
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=r"junk\.parquet: not a readable Parquet file"):
        load_problems(str(junk))


def _problems(n: int) -> list[Problem]:
    return [Problem(id=str(i), problem=f"p{i}", answer=str(i)) for i in range(n)]


def test_prompt_stream_visits_every_problem_once_per_epoch_in_a_new_order():
    stream = PromptStream(_problems(7), seed=3)
    first, second = stream.take(7), stream.take(7)
    assert sorted(p.id for p in first) == sorted(p.id for p in second) == sorted(str(i) for i in range(7))
    assert [p.id for p in first] != [p.id for p in second]
    assert stream.state_dict() == {"epoch": 1, "offset": 7}
    assert [p.id for p in PromptStream(_problems(7), seed=3).take(14)] == [p.id for p in first + second]


@pytest.mark.parametrize("consumed", [0, 3, 7, 9, 20])
def test_prompt_stream_state_round_trip(consumed):
    """A stream restored from a saved position yields exactly what the original yields next (epoch edges too)."""
    original = PromptStream(_problems(7), seed=11)
    original.take(consumed)
    state = json.loads(json.dumps(original.state_dict()))  # what a checkpoint stores survives serialization
    restored = PromptStream(_problems(7), seed=11)
    restored.load_state_dict(state)
    assert restored.take(17) == original.take(17)


def test_prompt_stream_refuses_an_empty_set():
    with pytest.raises(DataError, match="the training set is empty"):
        PromptStream([], seed=0)
