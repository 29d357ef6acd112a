"""``tepo eval --reward-function PATH:NAME``: the user's reward functions scored beside math-verify's
accuracy, per response in samples.jsonl and per benchmark in results.json; a bad one refused before any model
loads."""

from __future__ import annotations

import importlib.util
import json

import pytest

import tepo.models
from helpers import ROOT
from tepo.cli import main
from tepo.rewards import strip_trailer

EXAMPLE = ROOT / "examples" / "word_count"


def example_rewards():
    spec = importlib.util.spec_from_file_location("word_count_reward", EXAMPLE / "reward.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_eval_scores_the_user_s_functions_beside_accuracy(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "eval"
    argv = ["eval", "--model", str(tiny_model_dir), "--bench", str(EXAMPLE / "data.jsonl"), "--limit", "3"]
    argv += ["--max-new-tokens", "8", "--rollout", "hf", "--output-dir", str(out), "--no-progress"]
    for name in ("compute_score", "mentions_topic"):
        argv += ["--reward-function", f"{EXAMPLE / 'reward.py'}:{name}"]
    assert main(argv) == 0
    assert "compute_score" in capsys.readouterr().out  # the table's column
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    rewards = example_rewards()
    expected = {"compute_score": [], "mentions_topic": []}
    for record in records:
        (response,) = record["responses"]  # greedy: one per problem
        text = strip_trailer(response["text"])
        row = json.loads((EXAMPLE / "data.jsonl").read_text().splitlines()[record["index"]])
        expected["compute_score"].append(rewards.compute_score("word_count", text, record["gold"], {}))
        expected["mentions_topic"] += rewards.mentions_topic([record["problem"]], [text], [row["topic"]])
        assert {label: status for label, (_, status, _) in response["rewards"].items()} == {
            "compute_score": "scored",
            "mentions_topic": "scored",
        }
    got = json.loads((out / "results.json").read_text())["benchmarks"]["word_count"]["rewards"]
    for label, values in expected.items():
        assert got[label] == {
            "mean": pytest.approx(sum(values) / 3, abs=1e-12),
            "errors": 0,
            "timeouts": 0,
            "responses": 3,
        }


def test_a_bad_reward_function_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("the model loader was called")

    monkeypatch.setattr(tepo.models, "load_model_and_tokenizer", forbidden)
    argv = ["eval", "--model", "x", "--bench", str(EXAMPLE / "data.jsonl"), "--output-dir", str(tmp_path)]
    assert main([*argv, "--reward-function", f"{EXAMPLE / 'reward.py'}:nope"]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and "--reward-function[0] (nope: path" in err
        and "has no function 'nope' (its functions: compute_score, count_words, mentions_topic)" in err
    )
    assert main([*argv, "--reward-function", "no-colon"]) == 2
    assert "expected [LABEL=]PATH:NAME" in capsys.readouterr().err


def test_labels_tell_two_files_functions_of_one_name_apart_and_a_missing_one_lists_those_found(
    tmp_path, capsys, monkeypatch
):
    from tepo.evaluate.cli import eval_reward_functions

    for name in ("a", "b"):
        (tmp_path / f"{name}.py").write_text(
            f"def compute_score(solution_str):\n    return {name!r} == 'a'\n"
        )
    got = eval_reward_functions(
        [f"first={tmp_path / 'a.py'}:compute_score", f"second={tmp_path / 'b.py'}:compute_score"]
    )
    assert [(f.label, f.path) for f in got] == [
        ("first", str(tmp_path / "a.py")),
        ("second", str(tmp_path / "b.py")),
    ]
    with pytest.raises(Exception, match="listed twice"):
        eval_reward_functions([f"{tmp_path / 'a.py'}:compute_score", f"{tmp_path / 'b.py'}:compute_score"])
    with pytest.raises(Exception, match=r"has no function 'compute_scor' \(its functions: compute_score\)"):
        eval_reward_functions([f"{tmp_path / 'a.py'}:compute_scor"])


def test_a_reward_that_fails_on_a_whole_batch_stops_the_evaluation_with_its_reason_in_samples(
    tmp_path, tiny_model_dir, capsys
):
    reward = tmp_path / "my_reward.py"
    reward.write_text("def compute_score(solution_str):\n    raise ValueError('boom from my reward')\n")
    out = tmp_path / "eval"
    argv = ["eval", "--model", str(tiny_model_dir), "--bench", str(EXAMPLE / "data.jsonl"), "--limit", "2"]
    argv += ["--max-new-tokens", "4", "--rollout", "hf", "--output-dir", str(out), "--no-progress"]
    assert main([*argv, "--reward-function", f"mine={reward}:compute_score"]) == 2
    captured = capsys.readouterr()
    assert "warning: reward function 'mine' failed on response 0: raised ValueError: boom from my reward" in (
        captured.out + captured.err
    )
    (error,) = [line for line in captured.err.splitlines() if line.startswith("tepo: error:")]
    assert "'mine' failed on 2 of its 2 responses" in error and "--overwrite" in error
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    for record in records:
        value, status, detail = record["responses"][0]["rewards"]["mine"]
        assert (value, status) == (0.0, "error") and "ValueError: boom from my reward" in detail
    assert (out / "reward_failures.jsonl").is_file()
    assert "ValueError: boom from my reward" in (out / "reward_worker_0.log").read_text()  # the traceback
