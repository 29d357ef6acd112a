"""Convergence columns of the comparison table, on synthetic run directories with hand-computed answers: steps
and wall time to a share of the reference's seed-mean final held-out accuracy, "not reached", the held-out AUC;
and the committed tiny fixture tabulated and reported through the real CLI from its small files alone."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tepo.compare.measures import (
    convergence,
    curve_auc,
    entropy_kept,
    grad_norm_mean,
    held_out_curve,
    max_drop,
)
from tepo.compare.render import render_markdown
from tepo.compare.table import build_table

FIXTURE = Path(__file__).parents[1] / "fixtures" / "compare" / "tiny"


def make_run(run_dir: Path, curve: dict[int, float], *, steps: int, step_seconds: float) -> Path:
    """A finished run: ``curve[0]`` in eval_before.json, ``curve[s]`` for 0 < s < steps as eval rows,
    ``curve[steps]`` as summary 'after'."""
    run_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for step in range(1, steps + 1):
        row = {"step": step, "reward_mean": 0.1, "step_seconds": step_seconds}
        if step in curve and step < steps:
            row["eval_greedy_accuracy"] = curve[step]
        rows.append(row)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "config.yaml").write_text("{}\n")
    (run_dir / "eval_before.json").write_text(json.dumps({"eval_greedy_accuracy": curve[0]}))
    summary = {
        "steps": steps,
        "before": {"eval_greedy_accuracy": 0.0},  # eval_before.json wins: it is what the trainer scored
        "after": {"eval_greedy_accuracy": curve[steps]},
        "reward_last_third": 0.1,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


@pytest.fixture
def runs(tmp_path) -> dict[str, dict[int, Path]]:
    """grpo final 0.6 / 0.8 -> seed-mean 0.7, target 0.9 x 0.7 = 0.63.

    grpo seed0 0.2, 0.4, 0.5, 0.6 at steps 0, 2, 4, 6: never >= 0.63 (not reached)
    grpo seed1 0.2, 0.3, 0.6, 0.8: step 6, 6 x 10 s = 60 s
    tepo seed0 0.2, 0.7, 0.7, 0.7: step 2, 2 x 20 s = 40 s
    tepo seed1 0.2, 0.5, 0.65, 0.7: step 4, 4 x 20 s = 80 s
    dapo seed0 0.2 at step 0, 0.3 final at step 6, no eval rows: not reached
    """
    d = tmp_path / "cmp"
    curves = {
        "grpo": {0: {0: 0.2, 2: 0.4, 4: 0.5, 6: 0.6}, 1: {0: 0.2, 2: 0.3, 4: 0.6, 6: 0.8}},
        "tepo": {0: {0: 0.2, 2: 0.7, 4: 0.7, 6: 0.7}, 1: {0: 0.2, 2: 0.5, 4: 0.65, 6: 0.7}},
        "dapo": {0: {0: 0.2, 6: 0.3}},
    }
    seconds = {"grpo": 10.0, "tepo": 20.0, "dapo": 10.0}
    return {
        m: {s: make_run(d / m / f"seed{s}", c, steps=6, step_seconds=seconds[m]) for s, c in by_seed.items()}
        for m, by_seed in curves.items()
    }


def test_held_out_curve_points(runs):
    assert held_out_curve(runs["grpo"][0]) == [(0, 0.2), (2, 0.4), (4, 0.5), (6, 0.6)]
    assert held_out_curve(runs["dapo"][0]) == [(0, 0.2), (6, 0.3)]


def test_convergence_and_auc_closed_form(runs):
    from tepo.metrics import read_metrics

    rows = read_metrics(runs["tepo"][1] / "metrics.jsonl")
    curve = held_out_curve(runs["tepo"][1])
    assert convergence(curve, rows, 0.63) == (4, 80.0)
    assert convergence(curve, rows, 0.2) == (0, 0.0)  # the initial policy already there: step 0, no time
    assert convergence(curve, rows, 0.71) == (None, None)
    # (2 (0.2 + 0.4) / 2 + 2 (0.4 + 0.5) / 2 + 2 (0.5 + 0.6) / 2) / 6 = (0.6 + 0.9 + 1.1) / 6
    assert curve_auc(held_out_curve(runs["grpo"][0])) == pytest.approx(2.6 / 6)
    assert curve_auc(held_out_curve(runs["dapo"][0])) == pytest.approx(0.25)  # 6 (0.2 + 0.3) / 2 / 6
    assert curve_auc([(0, 0.5)]) is None


def test_table_convergence_columns(runs):
    table = build_table(runs, threshold=0.5)
    conv = table["convergence"]
    assert conv["reference"] == "grpo" and conv["share"] == 0.9
    assert conv["reference_final_mean"] == pytest.approx(0.7) and conv["target"] == pytest.approx(0.63)
    cells = {r["method"]: r["cells"] for r in table["rows"]}
    assert cells["tepo"]["steps_to_share"]["values"] == [2.0, 4.0]
    assert cells["tepo"]["steps_to_share"]["mean"] == 3.0
    assert cells["tepo"]["seconds_to_share"]["values"] == [40.0, 80.0]
    assert (cells["grpo"]["steps_to_share"]["values"], cells["grpo"]["steps_to_share"]["of"]) == ([6.0], 2)
    assert cells["grpo"]["seconds_to_share"]["values"] == [60.0]
    assert cells["dapo"]["steps_to_share"]["n"] == 0 and cells["dapo"]["steps_to_share"]["mean"] is None
    # AUC per seed: grpo 2.6/6 and (0.5 + 0.9 + 1.4)/6; tepo (0.9 + 1.4 + 1.4)/6 and (0.7 + 1.15 + 1.35)/6.
    assert cells["grpo"]["auc_held_out"]["values"] == pytest.approx([2.6 / 6, 2.8 / 6])
    assert cells["tepo"]["auc_held_out"]["values"] == pytest.approx([3.7 / 6, 3.2 / 6])
    assert cells["tepo"]["auc_held_out"]["best"] and cells["tepo"]["steps_to_share"]["best"]
    # Student t with 1 df: 0.575 -/+ 12.706205 x sd / sqrt(2), far outside the two seeds' values.
    assert cells["tepo"]["auc_held_out"]["low"] == pytest.approx(0.045575, abs=1e-6)
    md = render_markdown(table)
    assert "steps@90% grpo" in md and "wall s@90% grpo" in md and "held-out AUC" in md
    assert "not reached (0/1)" in md  # dapo
    assert re.search(r"\| 6\.0 \(1/2\) +\|", md)  # grpo: one of two seeds reached it


def test_paired_difference_and_seconds_per_step_columns(runs):
    cells = {r["method"]: r["cells"] for r in build_table(runs)["rows"]}
    # Final held-out, paired by seed against grpo (0.6, 0.8): tepo 0.7 - 0.6 = +0.1 and 0.7 - 0.8 = -0.1;
    # dapo has seed 0 only: 0.3 - 0.6 = -0.3; grpo's own row is empty.
    assert cells["tepo"]["held_out_delta"]["values"] == pytest.approx([0.1, -0.1])
    assert cells["tepo"]["held_out_delta"]["mean"] == pytest.approx(0.0)
    assert cells["dapo"]["held_out_delta"]["values"] == pytest.approx([-0.3])
    assert cells["grpo"]["held_out_delta"]["n"] == 0
    assert not any(c["held_out_delta"]["best"] for c in cells.values())  # a difference, not a ranking
    # Median step_seconds: 10 s per grpo/dapo step, 20 s per tepo step; lower is better.
    assert cells["grpo"]["seconds_per_step"]["values"] == [10.0, 10.0]
    assert cells["tepo"]["seconds_per_step"]["mean"] == 20.0
    assert cells["grpo"]["seconds_per_step"]["best"] and not cells["tepo"]["seconds_per_step"]["best"]
    md = render_markdown(build_table(runs))
    assert "Δ held-out vs grpo (paired)" in md and "| s/step" in md
    assert re.search(r"\| \+0\.000 \[-1\.271, \+1\.271\] +\|", md)  # tepo's paired difference (t, 1 df)


def test_max_drop_and_entropy_kept_closed_form():
    assert max_drop([(0, 0.2), (2, 0.6), (4, 0.4), (6, 0.5)]) == pytest.approx(0.2)  # 0.6 -> 0.4
    # 0.9 -> 0.6 is the larger of the two falls (0.5 -> 0.3 is 0.2)
    assert max_drop([(0, 0.5), (2, 0.3), (4, 0.9), (6, 0.6)]) == pytest.approx(0.3)
    assert max_drop([(0, 0.2), (2, 0.2), (4, 0.7)]) == 0.0  # never goes down
    assert max_drop([]) is None
    # 7 rows -> last third = 7 // 3 = 2 rows: (0.6 + 0.4) / 2 / 2.0 = 0.25; a row without entropy is skipped.
    rows = [
        {"step": s, "update/entropy_mean": e} for s, e in enumerate([2.0, 1.8, 1.5, 1.2, 0.9, 0.6, 0.4], 1)
    ]
    assert entropy_kept(rows) == pytest.approx(0.25)
    assert entropy_kept([*rows, {"step": 8, "update/entropy_mean": float("nan")}]) == pytest.approx(0.25)
    assert entropy_kept(rows[:2]) == pytest.approx(1.8 / 2.0)  # 2 rows: last third is 1 row
    assert entropy_kept([{"step": 1}]) is None and entropy_kept([{"step": 1, "entropy_mean": 0.0}]) is None


def test_grad_norm_mean_closed_form_and_in_the_table(runs):
    # (1.0 + 2.0 + 0.5) / 3; a step with no update logs NaN and a row without the metric is skipped.
    rows = [{"step": s, "update/grad_norm": n} for s, n in ((1, 1.0), (2, 2.0), (3, 0.5))]
    assert grad_norm_mean(rows) == pytest.approx(3.5 / 3)
    assert grad_norm_mean(
        [*rows, {"step": 4, "update/grad_norm": float("nan")}, {"step": 5}]
    ) == pytest.approx(3.5 / 3)
    assert grad_norm_mean([{"step": 1}]) is None
    # In the table: tepo seed 0 logs norms 1, 2, ..., 6 over its 6 steps -> 3.5 (under the old flat name, as the
    # committed studies do: read_metrics groups it); its other seed logs none.
    metrics = runs["tepo"][0] / "metrics.jsonl"
    logged = [json.loads(line) for line in metrics.read_text().splitlines()]
    metrics.write_text("".join(json.dumps(r | {"grad_norm": float(r["step"])}) + "\n" for r in logged))
    table = build_table(runs)
    tepo = next(r for r in table["rows"] if r["method"] == "tepo")
    assert (
        tepo["per_seed"]["0"]["grad_norm"] == pytest.approx(3.5) and "grad_norm" not in tepo["per_seed"]["1"]
    )
    assert tepo["cells"]["grad_norm"]["mean"] == pytest.approx(3.5) and tepo["cells"]["grad_norm"]["n"] == 1
    column = next(c for c in table["columns"] if c["key"] == "grad_norm")
    assert column["label"] == "grad norm"
    assert not any(
        r["cells"]["grad_norm"].get("best") for r in table["rows"]
    )  # descriptive: higher is not better
    assert "| grad norm" in render_markdown(table)


def test_stability_columns_in_the_table(runs):
    # grpo seed 0 curve 0.2, 0.4, 0.5, 0.6 (never falls); tepo seed 1 0.2, 0.5, 0.65, 0.7. Give grpo seed 1 a fall
    # 0.2, 0.3, 0.6, 0.8 -> rewrite its step-4 eval to 0.25: drop 0.3 - 0.25 = 0.05. Entropy: tepo seed 0 made
    # to fall 2.0 -> 0.5 over its 6 steps (last third: 2 rows, 0.6 and 0.4 -> 0.5 / 2.0 = 0.25).
    from tepo.metrics import read_metrics

    def rewrite(run_dir, edit):
        rows = read_metrics(run_dir / "metrics.jsonl")
        for row in rows:
            edit(row)
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    rewrite(runs["grpo"][1], lambda r: r.update(eval_greedy_accuracy=0.25) if r["step"] == 4 else None)
    entropies = dict(zip(range(1, 7), [2.0, 1.6, 1.2, 0.9, 0.6, 0.4]))
    rewrite(runs["tepo"][0], lambda r: r.update(entropy_mean=entropies[r["step"]]))
    cells = {r["method"]: r["cells"] for r in build_table(runs)["rows"]}
    assert cells["grpo"]["held_out_drop"]["values"] == pytest.approx([0.0, 0.05])
    assert cells["tepo"]["held_out_drop"]["values"] == pytest.approx([0.0, 0.0])
    assert cells["tepo"]["entropy_kept"]["values"] == pytest.approx([0.25])  # seed 1 logs no entropy
    assert (cells["tepo"]["entropy_kept"]["n"], cells["tepo"]["entropy_kept"]["of"]) == (1, 2)
    assert not any(c[k]["best"] for c in cells.values() for k in ("held_out_drop", "entropy_kept"))
    md = render_markdown(build_table(runs))
    assert "| held-out max drop" in md and "| entropy kept" in md and "0.250 (1/2)" in md


def test_per_seed_tables(runs):
    # Finals: grpo 0.6 / 0.8, tepo 0.7 / 0.7, dapo seed 0 only 0.3; the initial policy 0.2 on both seeds.
    table = build_table(runs)
    assert table["rows"][0]["per_seed"]["1"]["held_out"] == pytest.approx(0.8)
    md = render_markdown(table)
    per_seed = md.split("Per seed: held-out", 1)[1]
    lines = [line.replace(" ", "") for line in per_seed.strip().splitlines()[:4]]
    assert lines[0] == "|seed|initialpolicy|grpo|tepo|dapo|"
    assert lines[2] == "|0|0.200|0.600|0.700|0.300|"
    assert lines[3] == "|1|0.200|0.800|0.700|-|"  # dapo did not run seed 1
    assert "Per seed: sampled" not in md  # no run logged a sampled accuracy


def test_reference_and_share_options(runs):
    # Reference dapo (final 0.3), share 0.5 -> target 0.15: every run is there at step 0.
    table = build_table(runs, reference="dapo", convergence_share=0.5)
    assert table["convergence"]["target"] == pytest.approx(0.15)
    assert all(r["cells"]["steps_to_share"]["values"] == [0.0] * len(r["seeds"]) for r in table["rows"])
    # Without grpo the first method is the reference.
    no_grpo = {m: runs[m] for m in ("tepo", "dapo")}
    assert build_table(no_grpo)["convergence"]["reference"] == "tepo"
    with pytest.raises(ValueError, match=r"--reference 'ppo': not one of the methods \(grpo, tepo, dapo\)"):
        build_table(runs, reference="ppo")
    with pytest.raises(ValueError, match=r"--convergence-share: expected a share in \(0, 1\]"):
        build_table(runs, convergence_share=1.5)


# --------------------------------------------------------------------------------------------------------------
# The committed tiny fixture, through the real CLI
# --------------------------------------------------------------------------------------------------------------


def test_fixture_table_and_report_from_small_files(tmp_path, capsys):
    """Target: 0.9 x grpo's mean final (0.5 + 0.7) / 2 = 0.54.

    grpo: 0.25/0.40/0.50 never reaches it; 0.30/0.35/0.70 at step 4 (4 x 10 s). tepo: 0.25/0.60/0.65 and
    0.30/0.55/0.60 both at step 2 (2 x 12 s). AUC over 4 steps: grpo (0.65 + 0.9)/4, (0.65 + 1.05)/4;
    tepo (0.85 + 1.25)/4, (0.85 + 1.15)/4.
    """
    from tepo.cli import main

    d = tmp_path / "tiny"
    shutil.copytree(FIXTURE, d)
    assert not list(d.rglob("checkpoints"))
    assert main(["compare", "--table-only", "--dir", str(d), "--no-report"]) == 0
    table = json.loads((d / "table.json").read_text())
    cells = {r["method"]: r["cells"] for r in table["rows"]}
    assert table["convergence"]["target"] == pytest.approx(0.54)
    assert cells["grpo"]["held_out"]["mean"] == pytest.approx(0.6)
    assert cells["tepo"]["held_out"]["mean"] == pytest.approx(0.625)
    assert (cells["grpo"]["steps_to_share"]["values"], cells["grpo"]["steps_to_share"]["of"]) == ([4.0], 2)
    assert cells["grpo"]["seconds_to_share"]["values"] == [40.0]
    assert cells["tepo"]["steps_to_share"]["values"] == [2.0, 2.0]
    assert cells["tepo"]["seconds_to_share"]["values"] == [24.0, 24.0]
    assert cells["grpo"]["auc_held_out"]["values"] == pytest.approx([1.55 / 4, 1.7 / 4])
    assert cells["tepo"]["auc_held_out"]["values"] == pytest.approx([2.1 / 4, 2.0 / 4])
    assert table["initial"]["cells"]["held_out"]["values"] == pytest.approx([0.25, 0.30])
    md = (d / "table.md").read_text()
    assert "| tepo" in md and "**2.0**" in md and "4.0 (1/2)" in md

    assert main(["report", str(d)]) == 0
    page = (d / "report" / "index.html").read_text()
    assert "<script" not in page.lower() and "http://" not in page and "https://" not in page
    assert not re.search(r"(src|href)=\"(?!data:)", page)  # every image inline
    assert page.count("data:image/png;base64,") >= 3
    assert "steps@90% grpo" in page and "held-out AUC" in page
    assert "0 at every step of every run, not drawn: clip fraction, tokens (high)" in page
    assert "Convergence target (greedy): 0.9 x grpo's seed-mean final accuracy = 0.540" in page
    assert (d / "report" / "figures" / "curve_held_out.png").exists()
    # The sampled held-out curve is drawn too: 0.15 before, 0.3 at the step-2 eval, 0.4 final (grpo seed 0).
    assert held_out_curve(d / "grpo" / "seed0", "eval_sampled_accuracy") == [(0, 0.15), (2, 0.3), (4, 0.4)]
    assert (d / "report" / "figures" / "curve_held_out_sampled.png").exists()
    assert 'alt="held-out accuracy (one sample)"' in page
    capsys.readouterr()


def test_report_draws_finished_runs_only(tmp_path, capsys):
    """A half-trained run (config.yaml and 2 metrics rows, no summary.json) stays out of the figures, as it
    stays out of the table, and the page names it; with nothing finished, every started run is drawn."""
    from tepo.cli import main
    from tepo.report.html import finished_runs

    d = tmp_path / "tiny"
    shutil.copytree(FIXTURE, d)
    partial = d / "tepo" / "seed2"
    partial.mkdir()
    shutil.copy(d / "tepo" / "seed0" / "config.yaml", partial / "config.yaml")
    rows = (d / "tepo" / "seed0" / "metrics.jsonl").read_text().splitlines()[:2]
    (partial / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    runs = {m: {s: d / m / f"seed{s}" for s in (0, 1, 2)} for m in ("grpo", "tepo")}
    drawn, left_out = finished_runs(runs)
    assert {m: sorted(seeds) for m, seeds in drawn.items()} == {"grpo": [0, 1], "tepo": [0, 1]}
    assert left_out == ["grpo/seed2", "tepo/seed2"]
    assert main(["report", str(d)]) == 0
    page = (d / "report" / "index.html").read_text()
    assert "Not finished, left out of the table and the figures: tepo/seed2." in page
    for summary in d.glob("*/seed*/summary.json"):
        summary.unlink()
    drawn, left_out = finished_runs(runs)
    assert {m: sorted(seeds) for m, seeds in drawn.items()} == {"grpo": [0, 1], "tepo": [0, 1, 2]}
    assert left_out == []
    capsys.readouterr()


def test_cli_options_and_their_errors(tmp_path, capsys):
    from tepo.cli import main
    from tepo.compare.table import DEFAULT_CONVERGENCE_SHARE
    from tepo.report import compare_cli

    assert compare_cli.DEFAULT_CONVERGENCE_SHARE == DEFAULT_CONVERGENCE_SHARE
    d = tmp_path / "tiny"
    shutil.copytree(FIXTURE, d)
    args = ["compare", "--table-only", "--dir", str(d), "--no-report"]
    assert main([*args, "--reference", "tepo", "--convergence-share", "0.5"]) == 0
    conv = json.loads((d / "table.json").read_text())["convergence"]
    assert conv["reference"] == "tepo" and conv["target"] == pytest.approx(0.5 * 0.625)
    capsys.readouterr()
    assert main([*args, "--reference", "ppo"]) == 2
    assert "--reference 'ppo': not one of the methods" in capsys.readouterr().err
    assert main(["compare", "--table-only", "--dir", str(tmp_path / "none"), "--no-report"]) == 2
    assert "no runs found" in capsys.readouterr().err
    # --columns narrows what is printed (Markdown with --markdown), never table.md.
    assert main([*args, "--columns", "held_out_delta,held_out", "--markdown"]) == 0
    header = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| method"))
    assert [h.strip() for h in header.strip("|").split("|")] == [
        "method",
        "seeds",
        "Δ held-out vs grpo (paired)",
        "held-out",
    ]
    assert "| held-out AUC" in (d / "table.md").read_text()
    assert main([*args, "--columns", "held_out,auc"]) == 2
    assert "--columns: unknown column 'auc'; this table has held_out, sampled" in capsys.readouterr().err
    assert main(["compare", "--dir", str(d)]) == 2
    assert "--losses is required (unless --table-only)" in capsys.readouterr().err


def test_grad_norm_cv_closed_form_and_paired_in_the_table(runs):
    from tepo.compare.measures import grad_norm_cv

    # norms 1, 2, 3: mean 2, population sd sqrt(2/3) -> cv 0.4082; NaN steps and missing rows are skipped.
    rows = [{"step": s, "update/grad_norm": n} for s, n in ((1, 1.0), (2, 2.0), (3, 3.0))]
    assert grad_norm_cv(rows) == pytest.approx((2 / 3) ** 0.5 / 2)
    assert grad_norm_cv([*rows, {"step": 4, "update/grad_norm": float("nan")}, {"step": 5}]) == pytest.approx(
        (2 / 3) ** 0.5 / 2
    )
    assert grad_norm_cv(rows[:1]) is None  # one step has no spread
    assert grad_norm_cv([{"step": s, "update/grad_norm": 0.0} for s in (1, 2)]) is None
    # In the table, paired by seed: tepo seed 0 norms 1..6 (cv = sd(1..6)/3.5), grpo seed 0 constant 2 (cv 0).
    for method, norm in (("tepo", lambda step: float(step)), ("grpo", lambda step: 2.0)):
        metrics = runs[method][0] / "metrics.jsonl"
        logged = [json.loads(line) for line in metrics.read_text().splitlines()]
        metrics.write_text("".join(json.dumps(r | {"grad_norm": norm(r["step"])}) + "\n" for r in logged))
    table = build_table(runs)
    expected = (sum((k - 3.5) ** 2 for k in range(1, 7)) / 6) ** 0.5 / 3.5
    tepo = next(r for r in table["rows"] if r["method"] == "tepo")
    assert tepo["per_seed"]["0"]["grad_norm_cv"] == pytest.approx(expected)
    cell = table["paired"]["grad_norm_cv"]["tepo"]
    assert cell["n"] == 1 and cell["mean"] == pytest.approx(expected)  # tepo - grpo on seed 0
