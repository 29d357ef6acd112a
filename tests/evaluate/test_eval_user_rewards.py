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
        assert {label: status for label, (_, status) in response["rewards"].items()} == {
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
        err.count("\n") == 1 and "--reward-function[0] (nope: path" in err and "has no function 'nope'" in err
    )
    assert main([*argv, "--reward-function", "no-colon"]) == 2
    assert "expected PATH:NAME" in capsys.readouterr().err
