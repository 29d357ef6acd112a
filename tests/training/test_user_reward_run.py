"""Reward functions of the user's own through the trainer: a bad entry is one ``tepo: error:`` line before any
model loads, and the word-count example (examples/word_count: verl- and TRL-form functions on a non-math task)
trains two real steps with ``gdpo``, which gets each function's rewards as its own column, and logs
``reward/<name>_mean`` / ``_errors`` / ``_timeouts``."""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml

import tepo.models
import tepo.training.step
from helpers import ROOT, small_run_overrides
from tepo.cli import main
from tepo.config import load_config
from tepo.metrics import read_metrics
from tepo.training import train

EXAMPLE = str(ROOT / "examples" / "word_count" / "config.yaml")


@pytest.fixture
def no_model(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("the model loader was called before the bad reward function was refused")

    monkeypatch.setattr(tepo.models, "load_model_and_tokenizer", forbidden)


@pytest.mark.parametrize(
    ("file", "entry", "needles"),
    [
        (
            None,
            "{path: no/such/file.py, name: f}",
            ["reward.functions[1] (f: path no/such/file.py, name f)", "no such file"],
        ),
        ("def g(solution_str): return 1", "{path: PATH, name: f}", ["has no function 'f'"]),
        ("def f(a, b): return 1", "{path: PATH, name: f, label: mine}", ["(mine: path", "fit neither form"]),
        ("def f(solution_str):\n  return (", "{path: PATH, name: f}", ["syntax error in", "line 2"]),
        (None, "{path: no_such_module_47, name: f}", ["cannot import module 'no_such_module_47'"]),
        (None, "{path: x.py, name: f, label: format}", ["'format' is a built-in reward's name"]),
    ],
)
def test_a_bad_reward_function_is_one_line_before_any_model_loads(
    tmp_path, capsys, no_model, file, entry, needles
):
    path = tmp_path / "rewards.py"
    if file is not None:
        path.write_text(file)
    functions = f"reward.functions=[{{name: correctness}}, {entry.replace('PATH', str(path))}]"
    code = main(["train", "--output-dir", str(tmp_path / "runs"), "log.progress=false", functions])
    err = capsys.readouterr().err
    assert code == 2 and err.count("tepo: error:") == 1, err
    line = next(line for line in err.splitlines() if "reward.functions" in line)
    for needle in needles:
        assert needle in line, f"{needle!r} not in {line!r}"


def test_the_word_count_example_trains_with_gdpo_on_each_function(tmp_path, tiny_model_dir, monkeypatch):
    """Two steps of the example's config (tiny model, 2 prompts x 3 samples): the estimator is handed one
    column per function, equal to the rewards the step summed, and the log has each function's metrics."""
    monkeypatch.chdir(tmp_path)  # the example's paths are read from its own folder, whatever the directory
    seen = []
    real = tepo.training.step.compute_advantages

    def recording(name, rewards, group_size, **tensors):
        seen.append((name, rewards.clone(), tensors["reward_components"].clone(), tensors["reward_weights"]))
        return real(name, rewards, group_size, **tensors)

    monkeypatch.setattr(tepo.training.step, "compute_advantages", recording)
    extra = ["train.steps=2", f"model.name={tiny_model_dir}", "eval.size=0", "algorithm.advantage=gdpo"]
    config = load_config(EXAMPLE, small_run_overrides(tmp_path, *extra))
    result = train(config, log=lambda *_: None)

    assert [name for name, *_ in seen] == ["gdpo", "gdpo"]
    for _, rewards, components, weights in seen:
        assert components.shape == (6, 2) and weights.tolist() == [1.0, 0.25]
        torch.testing.assert_close(rewards, components @ weights)  # the summed reward is of these columns
        assert ((components[:, 1] == 0) | (components[:, 1] == 1)).all()  # mentions_topic is 0/1
    rows = read_metrics(result.run_dir / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2]
    for row, (_, _, components, _) in zip(rows, seen):
        means = [row["reward/compute_score_mean"], row["reward/mentions_topic_mean"]]
        assert means == pytest.approx(components.mean(0).tolist(), abs=1e-6)
        # no correctness among the functions: reward/mean is their weighted sum, not math-verify's verdict
        assert row["reward/mean"] == pytest.approx(means[0] + 0.25 * means[1], abs=1e-6)
        for name in ("compute_score", "mentions_topic"):
            assert row[f"reward/{name}_errors"] == 0 and row[f"reward/{name}_timeouts"] == 0
        assert math.isfinite(row["update/loss"])


def test_a_task_of_your_own_with_a_math_held_out_evaluation_gets_a_note(monkeypatch):
    from tepo.config import config_warnings

    monkeypatch.chdir(ROOT)
    (note,) = config_warnings(load_config(EXAMPLE, ["eval.size=4"]))
    assert "exclude correctness" in note and "eval.size=4" in note and "--reward-function" in note
    assert config_warnings(load_config(EXAMPLE, [])) == []  # the example's own eval.size: 0
    with_correctness = (
        "reward.functions=[{name: correctness}, {path: examples/word_count/reward.py, name: compute_score}]"
    )
    assert config_warnings(load_config(EXAMPLE, ["eval.size=4", with_correctness])) == []


FAILING_LATER = """
calls = 0


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    global calls
    calls += 1
    if calls > 6:  # step 1's 6 responses score; from step 2 on every call raises
        raise ValueError("boom from my reward")
    return float(len(solution_str) % 2)
"""


def test_a_reward_that_always_fails_stops_the_run_with_exit_2_and_a_resumable_checkpoint(
    tmp_path, capsys, tiny_model_dir
):
    """Step 1 scores, then every call raises: the console has the exception's text at once, the failures file
    its rows, and the run stops in step 2 with one message and exit 2; step 1's checkpoint is kept and the
    run resumes from it once the function is fixed."""
    reward = tmp_path / "my_reward.py"
    reward.write_text(FAILING_LATER)
    functions = f"reward.functions=[{{path: {reward}, name: compute_score}}]"
    extra = [f"model.name={tiny_model_dir}", "eval.size=0", "train.steps=3", "train.run_name=r", functions]
    code = main(["train", *small_run_overrides(tmp_path / "runs", *extra)])
    captured = capsys.readouterr()
    run_dir = tmp_path / "runs" / "r"
    assert code == 2, captured.err
    assert "warning: reward function 'compute_score' failed on response 0 in step 2" in captured.out
    assert "raised ValueError: boom from my reward (my_reward.py line 9)" in captured.out
    (error,) = [line for line in captured.err.splitlines() if line.startswith("tepo: error:")]
    assert "'compute_score' failed on 6 of its 6 responses in step 2" in error
    assert f"tepo train --resume {run_dir}" in error
    rows = [json.loads(line) for line in (run_dir / "reward_failures.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and {r["step"] for r in rows} == {2}
    assert "boom from my reward" in rows[0]["detail"]
    assert [row["step"] for row in read_metrics(run_dir / "metrics.jsonl")] == [1]
    assert (run_dir / "checkpoints").is_dir() and (run_dir / "reward_worker_0.log").is_file()
    # no math-verify counters where math-verify did not run
    assert not any(key in read_metrics(run_dir / "metrics.jsonl")[0] for key in MATH_VERIFY_METRICS)

    reward.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n"
    )
    assert main(["train", "--resume", str(run_dir)]) == 0
    assert [row["step"] for row in read_metrics(run_dir / "metrics.jsonl")] == [1, 2, 3]


MATH_VERIFY_METRICS = (
    "reward/errors",
    "reward/timeouts",
    "reward/no_answer",
    "reward/timeouts_total",
    "reward/parse_failures_total",
)


OWN_TASK_YAML = """base: own_task
data: {source: rows.jsonl}
reward:
  functions: [{path: my_reward.py, name: compute_score, weight: 1.0}]
"""
OWN_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(ground_truth.lower() in solution_str.lower())
"""


def test_the_own_task_preset_trains_on_a_20_row_word_file_from_another_directory(
    tmp_path, monkeypatch, capsys
):
    """The README's recipe as written: ``base: own_task``, a 20-row file of word answers and a verl-form reward,
    run with the embedded model from a directory that is not the config's. Nothing is added to the prompts,
    nothing is held out, and two steps train."""
    project = tmp_path / "project"
    project.mkdir()
    colors = ["red", "blue", "green", "black", "white"]
    rows = [{"problem": f"Name a color like {c} (row {i}).", "answer": c} for i, c in enumerate(colors * 4)]
    (project / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (project / "my_reward.py").write_text(OWN_REWARD)
    (project / "my_run.yaml").write_text(OWN_TASK_YAML)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    sizes = ["train.steps=2", "train.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=8"]
    run = ["rollout.backend=hf", "train.micro_batch_size=4", "reward.num_workers=1", "log.progress=false"]
    run += ["train.save_every=0", "train.save_final=false"]  # no 135M-parameter checkpoint to write
    argv = ["train", "--config", str(project / "my_run.yaml"), *sizes, *run, "train.run_name=own"]
    assert main(argv) == 0, capsys.readouterr().err
    run_dir = elsewhere / "runs" / "own"
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["data"]["instruction"] == "" and saved["eval"]["size"] == 0
    assert saved["data"]["source"] == str(project / "rows.jsonl")
    metrics = read_metrics(run_dir / "metrics.jsonl")
    assert [row["step"] for row in metrics] == [1, 2]
    assert all(row["reward/compute_score_errors"] == 0 for row in metrics)
    assert not (run_dir / "reward_failures.jsonl").exists()


def test_the_rows_held_out_of_a_data_file_are_stated_and_the_own_task_preset_holds_out_none(tmp_path):
    from tepo.training.datasets import held_out_note, load_datasets

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"problem": f"p{i}", "answer": str(i)}) + "\n" for i in range(60)))
    config = load_config("default", [f"data.source={rows}"])
    train_rows, held_out = load_datasets(config)
    assert (len(train_rows), len(held_out)) == (12, 48)
    note = held_out_note(config, len(train_rows))
    assert f"the last 48 of 60 problems of {rows} are held out of training" in note and "eval.size=0" in note
    own = load_config("own_task", [f"data.source={rows}"])
    assert own.data.instruction == "" and held_out_note(own, 60) is None
    assert [len(part) for part in load_datasets(own)] == [60, 0]
    assert held_out_note(load_config("default"), 1000) is None  # a procedural task has its own test split
