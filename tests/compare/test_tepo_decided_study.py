"""The tepo-decided study's committed main runs are the runs PLAN.md registered: its settings, one machine kind,
one shared held-out set of 500 problems, whole seeds in main.sh's order, and every run committed after the plan.
These check the study's integrity, not its outcome: they read no accuracy."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
STUDY = REPO / "docs" / "results" / "tepo-decided"
MAIN = STUDY / "main"
METHODS = ("grpo", "dapo", "tepo", "tepo_v2_kl_mask")  # main.sh's order within a seed
PLANNED = {
    ("train", "steps"): 20,
    ("train", "ppo_epochs"): 2,
    ("train", "mini_batch_prompts"): 1,
    ("rollout", "max_new_tokens"): 128,
    ("eval", "size"): 500,
    ("eval", "seed"): 0,
    ("eval", "samples"): 0,
    ("eval", "every"): 5,
}


def _finished() -> list[tuple[str, int, Path]]:
    return [
        (method, int(run.name[len("seed") :]), run)
        for method in METHODS
        for run in sorted((MAIN / method).glob("seed*"))
        if (run / "summary.json").exists()
    ]


def test_some_main_runs_are_committed():
    assert len(_finished()) >= 2


@pytest.mark.parametrize(
    "method, seed, run", _finished(), ids=[f"{method}-seed{seed}" for method, seed, _ in _finished()]
)
def test_a_main_run_has_the_plans_settings(method, seed, run):
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert {key: config[a][b] for (a, b), key in zip(PLANNED, PLANNED)} == PLANNED
    # A method is a preset: its loss is what the plan recorded for it (tepo_v2_kl_mask is the tepo loss + options).
    changes = json.loads((MAIN / "comparison.json").read_text())["method_changes"][method]
    assert config["algorithm"]["loss"] == changes["algorithm.loss"] and config["train"]["seed"] == seed
    assert config["algorithm"]["loss_options"] == changes["algorithm.loss_options"]
    assert json.loads((run / "summary.json").read_text())["steps"] == 20  # finished, not cut short


def test_the_main_runs_share_one_machine_kind_and_one_held_out_set():
    runs = _finished()
    machines = {
        (p["hardware"], p["native_bf16"])
        for p in (json.loads((r / "precision.json").read_text()) for *_, r in runs)
    }
    assert len(machines) == 1, f"pairs must come from one machine kind: {machines}"
    problem_sets = {
        frozenset(
            json.loads(line)["key"] for line in (r / "held_out" / "after.jsonl").read_text().splitlines()
        )
        for *_, r in runs
    }
    assert len(problem_sets) == 1 and len(next(iter(problem_sets))) == 500


def test_the_committed_runs_are_whole_seeds_in_main_sh_order():
    """Seed by seed, the methods in order: what is committed is seeds 0..k-1 whole and a prefix of seed k."""
    done = {(method, seed) for method, seed, _ in _finished()}
    order = [(method, seed) for seed in range(10) for method in METHODS]
    prefix = order[: len(done)]
    assert done == set(prefix), f"not a prefix of main.sh's order: missing {sorted(set(prefix) - done)}"


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()


def test_every_main_run_was_committed_after_the_plan():
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    if _git("rev-parse", "--is-shallow-repository") == "true":
        pytest.skip("a shallow clone has no history to check")
    plan = _git(
        "log", "--diff-filter=A", "--format=%H", "--", "docs/results/tepo-decided/PLAN.md"
    ).splitlines()
    assert len(plan) == 1, "PLAN.md was added once"
    for method, seed, run in _finished():
        path = str((run / "summary.json").relative_to(REPO))
        added = _git("log", "--diff-filter=A", "--format=%H", "--", path).splitlines()
        if not added:  # not committed yet (a run copied in during this session)
            continue
        assert (
            subprocess.run(["git", "merge-base", "--is-ancestor", plan[0], added[-1]], cwd=REPO).returncode
            == 0
        ), f"{method} seed {seed} was committed before PLAN.md"
        assert added[-1] != plan[0], f"{method} seed {seed} was committed with PLAN.md"


def test_the_registered_hypotheses_are_decidable_on_the_committed_runs():
    """hypotheses.yaml names measures and methods the study's table has (a method with no finished run yet is
    "not tested"); the verdicts themselves are not looked at here."""
    from tepo.compare.hypotheses import decide_all, read_hypotheses
    from tepo.compare.table import build_table

    runs = {method: {seed: MAIN / method / f"seed{seed}" for seed in range(10)} for method in METHODS}
    hypotheses, alpha = read_hypotheses(STUDY / "hypotheses.yaml")
    verdicts = decide_all(build_table(runs), hypotheses, alpha)
    assert [v.hypothesis.id for v in verdicts] == ["H1", "H2", "H3", "H4"]
    assert {v.verdict for v in verdicts} <= {"supported", "contradicted", "undecided", "not tested"}


def test_verdict_sh_refuses_to_decide_before_the_plans_40_runs_are_in(tmp_path):
    """verdict.sh (the analysis, committed before its data) makes no interim verdict: with one run short of the
    plan's 40 it stops with the count before running tepo compare."""
    main = tmp_path / "docs" / "results" / "tepo-decided" / "main"
    for method in METHODS:
        for seed in range(10):
            if (method, seed) != ("tepo_v2_kl_mask", 9):
                (main / method / f"seed{seed}").mkdir(parents=True)
                (main / method / f"seed{seed}" / "summary.json").write_text("{}")
    done = subprocess.run(
        ["bash", str(STUDY / "verdict.sh")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "TEPO": "false", "PYTHON": "false"},
    )
    assert done.returncode == 1
    assert "39 of the plan's 40 main runs" in done.stderr
