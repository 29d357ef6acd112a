"""The shared held-out set, per-problem records, the problem-level view, collapse and the words of the table."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tepo.compare.measures import collapsed, truncated_last_third
from tepo.compare.paired import paired_cell, verdict
from tepo.compare.problems import problem_view
from tepo.compare.record import discover_runs
from tepo.compare.render import render_markdown
from tepo.compare.table import build_table
from tepo.config import load_config
from tepo.data import Problem
from tepo.evaluate.records import (
    AFTER,
    problem_key,
    problem_records,
    read_problem_records,
    records_path,
    write_problem_records,
)
from tepo.training.datasets import load_datasets


def test_one_eval_seed_gives_every_train_seed_the_same_held_out_problems_and_none_is_trained_on():
    sets = []
    for seed in (0, 1, 2):
        config = load_config("compare_default", [f"train.seed={seed}", "eval.seed=7", "eval.size=500"])
        train, held_out = load_datasets(config)
        assert len(held_out) == 500
        assert not {p.problem for p in train} & {p.problem for p in held_out}
        sets.append([(p.problem, p.answer) for p in held_out])
    assert sets[0] == sets[1] == sets[2]
    # Without eval.seed each train.seed draws its own.
    a = load_datasets(load_config("compare_default", ["train.seed=0"]))[1]
    b = load_datasets(load_config("compare_default", ["train.seed=1"]))[1]
    assert [p.problem for p in a] != [p.problem for p in b]


class _Result:
    def __init__(self, correct: int, samples: int):
        self.num_correct, self.verdicts = correct, [None] * samples


def test_problem_records_round_trip(tmp_path):
    problems = [Problem(id=f"p{i}", problem=f"{i} + 1 = ?", answer=str(i + 1)) for i in range(3)]
    records = problem_records(
        problems, {"greedy": [_Result(1, 1), _Result(0, 1), _Result(1, 1)], "sampled": [_Result(2, 4)] * 3}
    )
    assert records[0] == {"id": "p0", "key": problem_key(problems[0]), "greedy_correct": 1, "sampled_correct": 2,
                          "samples": 4}  # fmt: skip
    path = records_path(tmp_path, AFTER)
    write_problem_records(path, records)
    read = read_problem_records(path)
    assert (
        list(read) == [problem_key(p) for p in problems]
        and read[problem_key(problems[1])]["greedy_correct"] == 0
    )
    assert read_problem_records(tmp_path / "none.jsonl") is None
    # The same id with another text is another problem.
    assert problem_key(Problem(id="p0", problem="2 + 2 = ?", answer="4")) != problem_key(problems[0])


def _write_run(
    run_dir: Path, *, before: float, after: float, outcomes: list[int], truncated: float = 0.1
) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text("{}\n")
    rows = [{"step": s, "reward/mean": 0.5, "rollout/frac_truncated": truncated, "time/step_seconds": 1.0}
            for s in (1, 2, 3)]  # fmt: skip
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "eval_before.json").write_text(json.dumps({"eval_greedy_accuracy": before}))
    (run_dir / "summary.json").write_text(json.dumps({"after": {"eval_greedy_accuracy": after}, "steps": 3}))
    records = [{"id": f"q{i}", "key": f"k{i}", "greedy_correct": c} for i, c in enumerate(outcomes)]
    write_problem_records(records_path(run_dir, AFTER), records)


def test_problem_level_view_counts_discordant_pairs(tmp_path):
    # Seed 0: method solves q0 q1, reference q1 q2 -> only method q0, only reference q2, both q1, neither q3.
    # Seed 1: method q0, reference q0 -> both q0, neither q1 q2 q3.
    _write_run(tmp_path / "m" / "seed0", before=0.1, after=0.5, outcomes=[1, 1, 0, 0])
    _write_run(tmp_path / "r" / "seed0", before=0.1, after=0.5, outcomes=[0, 1, 1, 0])
    _write_run(tmp_path / "m" / "seed1", before=0.1, after=0.25, outcomes=[1, 0, 0, 0])
    _write_run(tmp_path / "r" / "seed1", before=0.1, after=0.25, outcomes=[1, 0, 0, 0])
    mine = {s: tmp_path / "m" / f"seed{s}" for s in (0, 1)}
    theirs = {s: tmp_path / "r" / f"seed{s}" for s in (0, 1)}
    view = problem_view(mine, theirs, [0, 1])
    assert (view["only_method"], view["only_reference"], view["both"], view["neither"]) == (1, 1, 2, 4)
    assert view["problems"] == 4 and view["seeds"] == [0, 1] and view["mean"] == 0.0
    assert view["low"] <= 0.0 <= view["high"] and view["interval"] == "two-way bootstrap"
    # In the table: the view, and each run judged against the collapse rule.
    table = build_table({"r": theirs, "m": mine}, reference="r")
    assert table["problem_level"]["m"]["only_method"] == 1
    assert "Problem level" in render_markdown(table)


def test_collapse_rule():
    # Below the initial accuracy, or truncated on more than half the responses over the last third.
    assert collapsed(0.3, 0.2, 0.1) is True
    assert collapsed(0.3, 0.4, 0.6) is True
    assert collapsed(0.3, 0.3, 0.5) is False  # equal accuracy, exactly half truncated: not collapsed
    assert collapsed(None, None, None) is None
    rows = [{"rollout/frac_truncated": v} for v in (0.9, 0.9, 0.9, 0.2, 0.4, 0.6)]
    assert truncated_last_third(rows) == pytest.approx(0.5)  # last 2 of 6 rows


def test_collapsed_column_counts_runs(tmp_path):
    for seed, (after, truncated) in enumerate([(0.05, 0.1), (0.5, 0.9), (0.5, 0.1)]):
        _write_run(
            tmp_path / "grpo" / f"seed{seed}", before=0.1, after=after, outcomes=[1], truncated=truncated
        )
    table = build_table(discover_runs(tmp_path))
    cell = table["rows"][0]["cells"]["collapsed"]
    assert cell["values"] == [1.0, 1.0, 0.0]
    assert "| 2/3 " in render_markdown(table)


def test_words_follow_the_holm_adjusted_test():
    # Eight seeds all higher: sign-flip p = 2/256; with Holm over 2 methods that is 0.0156 < 0.05: "higher".
    strong = paired_cell({s: 0.1 + 0.01 * s for s in range(8)})
    strong["p_holm"] = min(1.0, 2 * strong["p"])
    assert strong["p"] == pytest.approx(2 / 256)
    assert verdict(strong).startswith("higher (sign-flip p = 0.008, Holm p = 0.016)")
    # Six seeds, five lower (TEPO v2 in tepo-claims): p = 0.125, never "lower" alone.
    weak = paired_cell(dict(enumerate([-0.125, -0.146, -0.229, -0.25, 0.125, -0.104])))
    weak["p_holm"] = 1.0
    assert verdict(weak) == "lower in direction only (sign-flip p = 0.125, Holm p = 1.000)"
    assert (weak["higher"], weak["equal"], weak["lower"]) == (1, 0, 5)
    assert verdict(paired_cell({})) == "not paired"


def test_the_claims_study_reads_tepo_v2_at_p_0125_and_calls_nothing_shown():
    """Issue 53's "done when": every paired cell of tepo-claims has a t interval, a sign-flip p and a Holm p;
    TEPO v2 against GRPO is p = 0.125 and not called lower."""
    directory = Path(__file__).resolve().parents[2] / "docs" / "results" / "tepo-claims"
    table = build_table(discover_runs(directory), threshold=0.3)
    for measure, cells in table["paired"].items():
        for method, cell in cells.items():
            if cell["n"] >= 2:
                assert cell["low"] is not None and cell["p"] is not None and cell["p_holm"] is not None, (
                    measure,
                    method,
                )
    v2 = table["paired"]["held_out"]["tepo_v2_kl_mask"]
    assert v2["p"] == pytest.approx(0.125) and v2["p_holm"] == pytest.approx(1.0)
    assert (v2["low"], v2["high"]) == (pytest.approx(-0.262, abs=5e-4), pytest.approx(0.019, abs=5e-4))
    assert not any(
        c.get("p_holm") is not None and c["p_holm"] < 0.05
        for cells in table["paired"].values()
        for c in cells.values()
    )
    assert "lower in direction only" in render_markdown(table)
    assert np.isclose(min(c["p"] for c in table["paired"]["held_out"].values()), 0.125)
