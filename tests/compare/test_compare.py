"""tepo compare: the comparison table from fixed synthetic run directories, the plan
(methods, seeds, identical settings, prompt schedules), reuse/resume without training, the default task."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch

from tepo.compare.measures import steps_to_threshold
from tepo.compare.planning import method_overrides, parse_methods, parse_seeds, plan_comparison
from tepo.compare.record import discover_runs, run_state, write_plan
from tepo.compare.render import render_markdown, render_terminal, write_table
from tepo.compare.runner import run_comparison
from tepo.compare.table import build_table
from tepo.config import ConfigError, save_config
from tepo.data import make_mixture_problems

# --------------------------------------------------------------------------------------------------------------
# Synthetic run directories
# --------------------------------------------------------------------------------------------------------------


def make_run(
    run_dir: Path,
    *,
    greedy: float,
    sampled: float = 0.1,
    rewards=(0.1, 0.2),
    step_seconds=10.0,
    before=(0.25, 0.05),
    benchmarks: dict | None = None,
    finished: bool = True,
) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    rows = [
        {"step": i + 1, "reward_mean": r, "step_seconds": step_seconds, "entropy_mean": 1.0 - 0.05 * i}
        for i, r in enumerate(rewards)
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "config.yaml").write_text("{}\n")
    if finished:
        third = max(1, len(rewards) // 3)
        summary = {
            "steps": len(rows),
            "before": {"eval_greedy_accuracy": before[0], "eval_sampled_accuracy": before[1]},
            "after": {"eval_greedy_accuracy": greedy, "eval_sampled_accuracy": sampled},
            "reward_last_third": sum(rewards[-third:]) / third,
        }
        (run_dir / "summary.json").write_text(json.dumps(summary))
    if benchmarks:  # as `tepo eval --output-dir <run_dir>/eval/final` writes it
        (run_dir / "eval" / "final").mkdir(parents=True, exist_ok=True)
        results = {
            "benchmarks": {name: {"num_problems": 10, "accuracy": acc} for name, acc in benchmarks.items()}
        }
        (run_dir / "eval" / "final" / "results.json").write_text(json.dumps(results))
    return run_dir


# --------------------------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------------------------


@pytest.fixture
def comparison(tmp_path) -> Path:
    """grpo: held-out 0.2/0.4/0.6; tepo: 0.5/0.5/0.5 (best); tepo seed 2 unfinished is not in the table."""
    d = tmp_path / "cmp"
    for seed, acc in enumerate([0.2, 0.4, 0.6]):
        # reward 0.1, 0.3, 0.5, 0.7: trailing 3-step means 0.1, 0.2, 0.3, 0.5 -> reaches 0.25 at step 3 (30 s).
        make_run(
            d / "grpo" / f"seed{seed}",
            greedy=acc,
            sampled=0.1 * (seed + 1),
            rewards=[0.1, 0.3, 0.5, 0.7],
            before=(0.25 + 0.01 * seed, 0.05),
        )
    for seed in range(2):
        make_run(
            d / "tepo" / f"seed{seed}",
            greedy=0.5,
            sampled=0.2,
            rewards=[0.5, 0.5, 0.5, 0.5],
            step_seconds=20.0,
            before=(0.25 + 0.01 * seed, 0.05),
        )
    make_run(d / "tepo" / "seed2", greedy=0.9, finished=False)
    return d


def test_table_values_and_best(comparison):
    runs = discover_runs(comparison)
    assert sorted(runs) == ["grpo", "tepo"] and sorted(runs["tepo"]) == [0, 1, 2]
    table = build_table(runs, threshold=0.25, window=3)
    rows = {r["method"]: r for r in table["rows"]}
    g, t = rows["grpo"]["cells"], rows["tepo"]["cells"]
    assert g["held_out"]["mean"] == pytest.approx(0.4)
    # Student t, 2 df: 0.4 -/+ 4.302653 x 0.2 / sqrt(3) = 0.4 -/+ 0.496828.
    assert (g["held_out"]["low"], g["held_out"]["high"]) == (
        pytest.approx(0.4 - 0.496828, abs=1e-6),
        pytest.approx(0.4 + 0.496828, abs=1e-6),
    )
    assert g["held_out"]["values"] == [0.2, 0.4, 0.6]
    assert t["held_out"]["mean"] == pytest.approx(0.5) and t["held_out"]["n"] == 2
    assert t["held_out"]["best"] and not g["held_out"]["best"]
    assert g["sampled"]["mean"] == pytest.approx(0.2) and t["sampled"]["mean"] == pytest.approx(0.2)
    assert g["sampled"]["best"] and t["sampled"]["best"]  # a tie marks both
    # steps@0.25: grpo at step 3 after 3 x 10 s; tepo at step 1 after 20 s -> tepo best on both.
    assert g["steps_to_threshold"]["mean"] == 3 and g["seconds_to_threshold"]["mean"] == pytest.approx(30)
    assert t["steps_to_threshold"]["mean"] == 1 and t["seconds_to_threshold"]["mean"] == pytest.approx(20)
    assert t["steps_to_threshold"]["best"] and t["seconds_to_threshold"]["best"]
    assert table["missing_runs"] == ["tepo/seed2"]
    # The initial policy: one value per seed (0.25, 0.26, 0.27).
    assert table["initial"]["cells"]["held_out"]["mean"] == pytest.approx(0.26)
    assert table["statistics"]["interval"] == "student-t" and table["statistics"]["adjustment"] == "holm"
    assert table["statistics"]["confidence"] == 0.95 and table["statistics"]["unit"] == "seed"
    assert "avg" not in [c["key"] for c in table["columns"]]  # one benchmark column: no average


def test_table_markdown_terminal_json(comparison, tmp_path):
    table = build_table(discover_runs(comparison), threshold=0.25)
    md = render_markdown(table)
    assert "| grpo " in md and "0.400 [-0.097, 0.897]" in md
    assert "**0.500**" in md  # tepo's held-out, best
    assert "initial policy" in md and "not finished (left out): tepo/seed2" in md
    term = render_terminal(table)
    assert "0.500*" in term and "**" not in term
    md_path, json_path = write_table(table, tmp_path)
    assert json.loads(json_path.read_text())["rows"][0]["method"] == "grpo"
    assert md_path.read_text() == md


def test_table_benchmarks_and_average(tmp_path):
    d = tmp_path / "cmp"
    make_run(d / "a" / "seed0", greedy=0.4, benchmarks={"gsm8k": 0.2, "math500": 0.1})
    make_run(d / "a" / "seed1", greedy=0.6, benchmarks={"gsm8k": 0.4, "math500": 0.3})
    make_run(d / "b" / "seed0", greedy=0.5, benchmarks={"gsm8k": 0.1, "math500": 0.0})
    table = build_table(discover_runs(d))
    keys = [c["key"] for c in table["columns"]]
    assert keys[:4] == ["held_out", "bench:gsm8k", "bench:math500", "avg"]
    a = next(r for r in table["rows"] if r["method"] == "a")["cells"]
    # Per seed: (0.4 + 0.2 + 0.1) / 3 = 0.2333 and (0.6 + 0.4 + 0.3) / 3 = 0.4333; mean 0.3333.
    assert a["avg"]["values"] == [pytest.approx(0.7 / 3), pytest.approx(1.3 / 3)]
    assert a["avg"]["mean"] == pytest.approx(1 / 3)
    assert a["avg"]["best"]


def _add_pass_at_k(run_dir: Path, before: dict, after: dict) -> None:
    """What eval.pass_k_samples adds: eval_pass@k in eval_before.json and in the summary's before/after."""
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["before"] |= before
    summary["after"] |= after
    (run_dir / "summary.json").write_text(json.dumps(summary))
    (run_dir / "eval_before.json").write_text(json.dumps(summary["before"]))


def test_pass_at_k_columns_for_the_runs_that_have_them(comparison):
    # grpo seeds 0 and 1 scored pass@k (n = 2), seed 2 and tepo did not (runs made before the option).
    for seed, (p1, p2) in enumerate([(0.3, 0.5), (0.4, 0.7)]):
        _add_pass_at_k(
            comparison / "grpo" / f"seed{seed}",
            {"eval_pass@1": 0.1, "eval_pass@2": 0.2},
            {"eval_pass@1": p1, "eval_pass@2": p2},
        )
    table = build_table(discover_runs(comparison), threshold=0.25)
    keys = [c["key"] for c in table["columns"]]
    assert keys.index("pass@1") + 1 == keys.index("pass@2")
    rows = {r["method"]: r["cells"] for r in table["rows"]}
    assert rows["grpo"]["pass@2"]["values"] == [0.5, 0.7] and rows["grpo"]["pass@2"]["of"] == 3
    assert rows["grpo"]["pass@1"]["mean"] == pytest.approx(0.35)
    assert rows["tepo"]["pass@1"]["n"] == 0 and rows["tepo"]["pass@1"]["mean"] is None
    assert table["initial"]["cells"]["pass@2"]["mean"] == pytest.approx(0.2)  # seed 0's initial policy
    md = render_markdown(table)
    assert (
        "pass@1" in md.splitlines()[0] and "**0.350** [-0.285, 0.985]" in md
    )  # the only one: best (t, 1 df)


def test_no_pass_at_k_column_without_pass_at_k(comparison):
    keys = [c["key"] for c in build_table(discover_runs(comparison), threshold=0.25)["columns"]]
    assert not [k for k in keys if k.startswith("pass@")]


def test_steps_to_threshold_window_and_never():
    rows = [
        {"step": 1, "reward/mean": 0.9, "time/step_seconds": 5},
        {"step": 2, "reward/mean": 0.0, "time/step_seconds": 5},
        {"step": 3, "reward/mean": 0.0, "time/step_seconds": 5},
    ]
    assert steps_to_threshold(rows, 0.5, window=1) == (1, 5.0)
    assert steps_to_threshold(rows, 0.5, window=3) == (1, 5.0)  # the trailing mean of one step is 0.9
    assert steps_to_threshold(rows[1:], 0.5, window=3) == (None, None)
    with pytest.raises(ValueError, match="window"):
        steps_to_threshold(rows, 0.5, window=0)


# --------------------------------------------------------------------------------------------------------------
# Planning: methods, seeds, identical settings
# --------------------------------------------------------------------------------------------------------------


def test_parse_seeds_and_methods():
    assert parse_seeds("3") == [0, 1, 2]
    assert parse_seeds("0,4,7") == [0, 4, 7]
    for bad in ("0", "x", "1,1"):
        with pytest.raises(ConfigError, match="--seeds"):
            parse_seeds(bad)
    assert parse_methods("grpo, tepo") == ["grpo", "tepo"]
    with pytest.raises(ConfigError, match="twice"):
        parse_methods("grpo,grpo")


def test_method_overrides_loss_and_preset():
    assert method_overrides("gspo") == {"algorithm.loss": "gspo", "algorithm.loss_options": {}}
    kl = method_overrides("tepo_kl")
    assert kl["algorithm.loss"] == "tepo" and kl["algorithm.kl_coef"] == 0.001
    assert kl["algorithm.loss_options"] == {"eps": 0.2}
    with pytest.raises(ConfigError, match="neither a registered loss"):
        method_overrides("not_a_loss")


def test_plan_identical_settings_and_prompt_schedules(tmp_path):
    plan = plan_comparison(tmp_path, ["grpo", "tepo", "tepo_v2_kl_mask"], [0, 1], overrides=["train.steps=3"])
    assert len(plan.runs) == 6
    by = {(r.method, r.seed): r.config for r in plan.runs}
    assert by[("grpo", 0)].algorithm.loss == "grpo" and by[("tepo", 1)].train.seed == 1
    assert by[("grpo", 0)].data.source == by[("tepo", 0)].data.source == "arithmetic-mix"  # the same task
    # Same seed -> the same prompts in the same order for every method; another seed -> another order.
    d0, d1 = plan.prompt_digests["0"], plan.prompt_digests["1"]
    assert len(set(d0.values())) == 1 and len(set(d1.values())) == 1 and d0["grpo"] != d1["grpo"]
    assert any("tepo_v2_kl_mask also changes train.ppo_epochs=2" in n for n in plan.notes)
    assert by[("tepo_v2_kl_mask", 0)].train.ppo_epochs == 2 and by[("grpo", 0)].train.ppo_epochs == 1
    # Set on the command line, the preset's key is every method's: no note says the rows differ in it.
    same = plan_comparison(tmp_path, ["grpo", "tepo_v2_kl_mask"], [0], overrides=["train.ppo_epochs=2"])
    assert not any("also changes" in n for n in same.notes)
    assert {r.config.train.ppo_epochs for r in same.runs} == {2}
    with pytest.raises(ConfigError, match=r"train\.seed is set by tepo compare"):
        plan_comparison(tmp_path, ["grpo"], [0], overrides=["train.seed=3"])
    with pytest.raises(ConfigError, match=r"train\.steps: must be >= 1"):
        plan_comparison(tmp_path, ["grpo"], [0], overrides=["train.steps=0"])


def test_plan_notes_dynamic_sampling(tmp_path):
    plan = plan_comparison(tmp_path, ["grpo", "clip_higher"], [0], overrides=["train.steps=2"])
    assert any("dynamic sampling" in n for n in plan.notes)


# --------------------------------------------------------------------------------------------------------------
# Running: reuse, resume, restart, new -- without training
# --------------------------------------------------------------------------------------------------------------


def _never(*args, **kwargs):
    raise AssertionError("training must not be invoked")


def _finish(spec, greedy=0.5):
    spec.run_dir.mkdir(parents=True, exist_ok=True)
    save_config(spec.config, spec.run_dir / "config.yaml")
    (spec.run_dir / "summary.json").write_text(json.dumps({"after": {"eval_greedy_accuracy": greedy}}))


def test_finished_runs_are_reused_without_training(tmp_path):
    plan = plan_comparison(tmp_path, ["grpo", "tepo"], [0, 1], overrides=["train.steps=2"])
    for spec in plan.runs:
        _finish(spec)
    outcomes = run_comparison(plan, train_fn=_never, resume_fn=_never, log=lambda *a: None)
    assert [o.action for o in outcomes] == ["reused"] * 4
    assert (tmp_path / "comparison.json").exists()
    assert json.loads((tmp_path / "comparison.json").read_text())["methods"] == ["grpo", "tepo"]


def test_a_run_finished_without_pass_at_k_is_reused_by_a_plan_that_asks_for_it(tmp_path):
    # eval.pass_k_samples adds measures at the start and the end only: the committed seeds stay the same runs.
    old = plan_comparison(tmp_path, ["grpo"], [0], overrides=["train.steps=2"])
    _finish(old.runs[0])
    plan = plan_comparison(tmp_path, ["grpo"], [0], overrides=["train.steps=2", "eval.pass_k_samples=8"])
    assert plan.runs[0].config.eval.pass_k_samples == 8
    outcomes = run_comparison(plan, train_fn=_never, resume_fn=_never, log=lambda *a: None)
    assert [o.action for o in outcomes] == ["reused"]


def test_a_study_grows_by_seeds_and_methods_and_its_table_keeps_every_run(tmp_path):
    # Seeds 0-1 of grpo and tepo, then seed 2 of grpo and a new method (with pass@k on): one plan, every run.
    first = plan_comparison(tmp_path, ["grpo", "tepo"], [0, 1], overrides=["train.steps=2"])
    for spec in first.runs:
        _finish(spec)
    run_comparison(first, train_fn=_never, resume_fn=_never, log=lambda *a: None)
    more = plan_comparison(
        tmp_path, ["grpo", "dapo"], [2], overrides=["train.steps=2", "eval.pass_k_samples=8"]
    )
    run_comparison(more, train_fn=lambda config, run_dir: _finish(next(r for r in more.runs if r.run_dir == run_dir)),
                   resume_fn=_never, log=lambda *a: None)  # fmt: skip
    plan = json.loads((tmp_path / "comparison.json").read_text())
    assert plan["methods"] == ["grpo", "tepo", "dapo"] and plan["seeds"] == [0, 1, 2]
    assert plan["earlier_plans"] == [
        {
            "base_config": "compare_default",
            "overrides": ["train.steps=2", "eval.seed=0"],  # the shared held-out draw
            "methods": ["grpo", "tepo"],
            "seeds": [0, 1],
        }
    ]
    assert sorted(plan["prompt_digests"]) == ["0", "1", "2"]
    runs = discover_runs(tmp_path)
    assert {m: sorted(s) for m, s in runs.items()} == {"grpo": [0, 1, 2], "tepo": [0, 1], "dapo": [2]}
    table = build_table(runs)
    assert {r["method"]: r["seeds"] for r in table["rows"]} == {
        "grpo": [0, 1, 2],
        "tepo": [0, 1],
        "dapo": [2],
    }
    assert table["missing_runs"] == []  # no tepo/seed2 or dapo/seed0: never planned
    # Other training settings in the same directory replace the plan (their runs would not be comparable).
    other = plan_comparison(tmp_path, ["grpo"], [0], overrides=["train.steps=3"])
    write_plan(other)
    replaced = json.loads((tmp_path / "comparison.json").read_text())
    assert replaced["methods"] == ["grpo"] and replaced["seeds"] == [0]
    assert replaced["notes"][-1].startswith("replaced an earlier plan with other settings")


@pytest.mark.parametrize("max_new, reused", [(64, True), (256, True), (512, False)])
def test_a_planned_auto_layout_matches_the_layout_a_run_used(tmp_path, max_new, reused):
    """train.micro_batch_tokens auto is compared by what it resolves to: a run saved with null (before auto was
    the default) is the planned run at 64 new tokens; from 512 on auto means a 4096-token budget, another layout."""
    overrides = ["train.steps=2", f"rollout.max_new_tokens={max_new}"]
    plan = plan_comparison(tmp_path, ["tepo"], [0], overrides=overrides)
    (spec,) = plan.runs
    assert spec.config.train.micro_batch_tokens == "auto"
    spec.run_dir.mkdir(parents=True)
    save_config(
        dataclasses.replace(
            spec.config, train=dataclasses.replace(spec.config.train, micro_batch_tokens=None)
        ),
        spec.run_dir / "config.yaml",
    )
    (spec.run_dir / "summary.json").write_text(json.dumps({"after": {"eval_greedy_accuracy": 0.5}}))
    if reused:
        outcomes = run_comparison(plan, train_fn=_never, resume_fn=_never, log=lambda *a: None)
        assert [o.action for o in outcomes] == ["reused"]
    else:
        with pytest.raises(ConfigError, match=r"different settings \(train.micro_batch_tokens\)"):
            run_comparison(plan, train_fn=_never, resume_fn=_never, log=lambda *a: None)


def test_interrupted_new_and_mismatched_runs(tmp_path):
    from tepo.checkpoint import save_checkpoint

    plan = plan_comparison(tmp_path, ["grpo", "tepo"], [0], overrides=["train.steps=2"])
    grpo, tepo = plan.runs
    # grpo: interrupted after a checkpoint -> resumed.
    grpo.run_dir.mkdir(parents=True)
    save_config(grpo.config, grpo.run_dir / "config.yaml")
    save_checkpoint(grpo.run_dir, 1, torch.nn.Linear(2, 2), {"note": "synthetic"})
    (grpo.run_dir / "eval_before.json").write_text(json.dumps({"eval_greedy_accuracy": 0.25}))
    calls = []
    outcomes = run_comparison(
        plan,
        train_fn=lambda config, run_dir: calls.append(("train", run_dir, config)),
        resume_fn=lambda run_dir: calls.append(("resume", run_dir)),
        log=lambda *a: None,
    )
    assert [o.action for o in outcomes] == ["resumed", "trained"]
    assert calls[0] == ("resume", grpo.run_dir)
    assert calls[1][:2] == ("train", tepo.run_dir) and calls[1][2].algorithm.loss == "tepo"
    # The initial evaluation is the same for both losses at one seed: copied, not recomputed.
    assert json.loads((tepo.run_dir / "eval_before.json").read_text()) == {"eval_greedy_accuracy": 0.25}

    # tepo: interrupted with metrics but no checkpoint -> partial log moved aside, restarted from step 0.
    save_config(tepo.config, tepo.run_dir / "config.yaml")
    (tepo.run_dir / "metrics.jsonl").write_text('{"step": 1}\n')
    assert run_state(tepo.run_dir) == "interrupted"
    calls.clear()
    run_comparison(
        plan,
        train_fn=lambda config, run_dir: calls.append(("train", run_dir)),
        resume_fn=lambda run_dir: calls.append(("resume", run_dir)),
        log=lambda *a: None,
    )
    assert calls == [("resume", grpo.run_dir), ("train", tepo.run_dir)]
    assert not (tepo.run_dir / "metrics.jsonl").exists()
    assert len(list(tepo.run_dir.glob("metrics.restarted-*.jsonl"))) == 1

    # A run directory holding other settings is an error, not silently reused.
    _finish(tepo)
    other = plan_comparison(tmp_path, ["grpo", "tepo"], [0], overrides=["train.steps=3"])
    with pytest.raises(ConfigError, match=r"different settings \(train.steps\)"):
        run_comparison(other, train_fn=_never, resume_fn=lambda run_dir: None, log=lambda *a: None)


def test_compare_cli_table_only(comparison, capsys):
    from tepo.cli import main

    (comparison / "grpo" / "seed0" / "config.yaml").unlink()  # discovery works from plan or folders
    rc = main(
        [
            "compare",
            "--losses",
            "grpo,tepo",
            "--seeds",
            "3",
            "--dir",
            str(comparison),
            "--table-only",
            "--no-report",
            "--threshold",
            "0.25",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "0.400* [-0.097, 0.897]" not in out and "0.400 [-0.097, 0.897]" in out and "0.500*" in out
    assert (comparison / "table.md").exists() and (comparison / "table.json").exists()


# --------------------------------------------------------------------------------------------------------------
# The default task
# --------------------------------------------------------------------------------------------------------------


def test_mixture_task_levels_answers_and_split():
    train = make_mixture_problems(300, split="train", seed=0)
    test = make_mixture_problems(60, split="test", seed=0)
    assert [p.id.rsplit("-L", 1)[1] for p in train[:6]] == ["1", "2", "3", "1", "2", "3"]
    assert not {p.problem for p in train} & {p.problem for p in test}
    assert make_mixture_problems(60, split="test", seed=0) == test  # deterministic
    for p in train:
        nums = [int(x) for x in re.findall(r"\d+", p.problem)]
        level = p.id[-1]
        if level == "2":
            a, b = nums
            assert int(p.answer) in (a + b, a * b) and max(a, b) >= 10
        if level == "1":
            assert max(nums) <= 9


def test_compare_default_preset_loads():
    from tepo.config import load_config

    config = load_config("compare_default")
    assert config.data.source == "arithmetic-mix" and config.train.steps == 12 and config.eval.size % 3 == 0


# --------------------------------------------------------------------------------------------------------------
# The real trainer (slow): 2 losses x 1 seed x 2 steps, then a second invocation reuses everything
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.model
def test_real_comparison_tiny(tmp_path):
    overrides = [
        "train.steps=2",
        "train.prompts_per_step=2",
        "rollout.group_size=4",
        "rollout.max_new_tokens=24",
        "eval.size=6",
        "eval.samples=1",
        "log.progress=false",
    ]
    plan = plan_comparison(tmp_path, ["grpo", "tepo"], [0, 1], overrides=overrides)
    outcomes = run_comparison(plan)
    assert [o.action for o in outcomes] == ["trained"] * 4
    rows = {
        m: [json.loads(x) for x in (tmp_path / m / "seed0" / "metrics.jsonl").read_text().splitlines()]
        for m in ("grpo", "tepo")
    }
    # Same seed, same initial policy, same sampling seed: step 1 saw the same samples under both losses.
    assert rows["grpo"][0]["reward/mean"] == rows["tepo"][0]["reward/mean"]
    assert rows["grpo"][0]["rollout/response_length_mean"] == rows["tepo"][0]["rollout/response_length_mean"]
    before = [json.loads((tmp_path / m / "seed0" / "eval_before.json").read_text()) for m in ("grpo", "tepo")]
    assert before[0] == before[1]
    # One held-out draw for every run (eval.seed), each problem's outcome on disk, before and after training.
    keys = {
        (m, s, when): [
            json.loads(x)["key"]
            for x in (tmp_path / m / f"seed{s}" / "held_out" / f"{when}.jsonl").read_text().splitlines()
        ]
        for m in ("grpo", "tepo")
        for s in (0, 1)
        for when in ("before", "after")
    }
    assert len({tuple(v) for v in keys.values()}) == 1 and len(next(iter(keys.values()))) == 6
    again = run_comparison(plan_comparison(tmp_path, ["grpo", "tepo"], [0, 1], overrides=overrides))
    assert [o.action for o in again] == ["reused"] * 4
    table = build_table(discover_runs(tmp_path))
    assert {r["method"] for r in table["rows"]} == {"grpo", "tepo"}
    view = table["problem_level"]["tepo"]
    assert view["seeds"] == [0, 1] and view["problems"] == 6
    assert view["only_method"] + view["only_reference"] + view["both"] + view["neither"] == 12
    assert all(r["cells"]["collapsed"]["n"] == 2 for r in table["rows"])
    text = render_markdown(table)
    assert "Problem level" in text and "| collapsed |" in text.splitlines()[0].replace(
        " collapsed ", "| collapsed |"
    )


# --------------------------------------------------------------------------------------------------------------
# Precision (tepo.precision): runs of different precision share a table only with a column, and are never paired
# --------------------------------------------------------------------------------------------------------------


def _record_precision(run_dir: Path, bf16: bool) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["precision"] = {"model_autocast_bf16": bf16, "hardware": "AMD EPYC 7B13" if not bf16 else "Zen 4"}
    (run_dir / "summary.json").write_text(json.dumps(summary))


def test_runs_of_one_precision_get_no_column(comparison):
    table = build_table(discover_runs(comparison), threshold=0.25)
    assert table["precision"] == {"mixed": False, "unpaired": []}
    assert "precision" not in render_markdown(table).splitlines()[0]


def test_mixed_precision_is_a_column_and_is_not_paired(comparison):
    for seed in range(3):
        _record_precision(comparison / "grpo" / f"seed{seed}", bf16=True)
    _record_precision(
        comparison / "tepo" / "seed0", bf16=False
    )  # seed 1: config.yaml {} -> bf16 (old default)
    table = build_table(discover_runs(comparison), threshold=0.25, reference="grpo")
    assert table["precision"]["mixed"] is True
    assert table["precision"]["unpaired"] == ["tepo/seed0 (float32) vs grpo (bf16)"]
    tepo = next(r for r in table["rows"] if r["method"] == "tepo")
    assert tepo["precision"] == ["bf16", "float32"]
    # Only seed 1 is differenced: 0.5 - 0.4.
    assert tepo["cells"]["held_out_delta"]["n"] == 1
    assert tepo["cells"]["held_out_delta"]["mean"] == pytest.approx(0.1)
    text = render_markdown(table)
    header = text.splitlines()[0]
    assert [c.strip() for c in header.split("|")][3] == "precision"
    assert re.search(r"\| tepo +\| 2 +\| bf16/float32 +\|", text)
    assert (
        "not paired (different precision or machine" in text and "tepo/seed0 (float32) vs grpo (bf16)" in text
    )


def test_runs_of_one_precision_on_two_machines_are_not_paired(comparison):
    # bf16 on both, but recorded on two CPU kinds: their float arithmetic differs, so no paired difference.
    # A run that recorded no machine (made before 2026-12-05) pairs with its seed's.
    for seed in range(3):
        _record_precision(comparison / "grpo" / f"seed{seed}", bf16=True)  # "Zen 4"
    summary = json.loads((comparison / "tepo" / "seed0" / "summary.json").read_text())
    summary["precision"] = {"model_autocast_bf16": True, "hardware": "Intel Xeon (AMX)"}
    (comparison / "tepo" / "seed0" / "summary.json").write_text(json.dumps(summary))
    table = build_table(discover_runs(comparison), threshold=0.25, reference="grpo")
    assert table["precision"]["unpaired"] == ["tepo/seed0 (Intel Xeon (AMX)) vs grpo (Zen 4)"]
    tepo = next(r for r in table["rows"] if r["method"] == "tepo")
    assert tepo["cells"]["held_out_delta"]["values"] == [pytest.approx(0.1)]  # seed 1 only: 0.5 - 0.4


def test_a_started_run_with_resolved_precision_matches_its_auto_plan(tmp_path):
    """config.yaml holds the values auto resolved to (true/bfloat16 or false/float32): still the planned run."""
    import dataclasses

    plan = plan_comparison(tmp_path, ["grpo"], [0], overrides=["train.steps=2"])
    (spec,) = plan.runs
    resolved = dataclasses.replace(
        spec.config,
        model=dataclasses.replace(spec.config.model, autocast_bf16=False),
        rollout=dataclasses.replace(
            spec.config.rollout,
            autocast_bf16=False,
            vllm=dataclasses.replace(spec.config.rollout.vllm, dtype="float32"),
        ),
    )
    spec.run_dir.mkdir(parents=True)
    save_config(resolved, spec.run_dir / "config.yaml")
    (spec.run_dir / "summary.json").write_text(json.dumps({"after": {"eval_greedy_accuracy": 0.5}}))
    outcomes = run_comparison(plan, train_fn=_never, resume_fn=_never, log=lambda *a: None)
    assert [o.action for o in outcomes] == ["reused"]
