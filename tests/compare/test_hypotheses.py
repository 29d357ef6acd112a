"""Pre-registered hypotheses decided by their stated rules (tepo.compare.hypotheses): each verdict on paired cells
built by the table's own code (tepo.compare.paired), the file's errors, and the CLI on a committed study."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from tepo.compare.hypotheses import (
    Hypothesis,
    HypothesisError,
    decide,
    decide_all,
    read_hypotheses,
    render_verdicts,
)
from tepo.compare.paired import add_holm, paired_cell

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
SEEDS = range(10)


def _family(**differences: list[float]) -> dict[str, dict]:
    """Paired cells of several methods (their per-seed differences), Holm-adjusted together as the table does."""
    cells = {method: paired_cell(dict(zip(SEEDS, values))) for method, values in differences.items()}
    add_holm(cells.values())
    return cells


CLEARLY_UP = [0.08, 0.11, 0.09, 0.12, 0.10, 0.07, 0.13, 0.10, 0.09, 0.11]  # every seed higher: p = 2/1024
NOISE = [0.05, -0.04, 0.02, -0.06, 0.03, -0.01, 0.04, -0.05, 0.01, -0.02]
H_UP = Hypothesis("H", "method is higher", "held_out", "a", "higher")


def test_a_difference_in_the_expected_direction_at_holm_p_below_alpha_is_supported():
    family = _family(a=CLEARLY_UP, b=NOISE, c=NOISE)
    verdict = decide(H_UP, family, {})
    assert verdict.verdict == "supported"
    assert verdict.p_holm == pytest.approx(3 * 2 / 1024)  # Holm: the smallest of three p-values times 3
    assert verdict.n == 10 and verdict.mean == pytest.approx(sum(CLEARLY_UP) / 10)


def test_the_other_direction_at_holm_p_below_alpha_contradicts_and_noise_leaves_it_undecided():
    family = _family(a=[-v for v in CLEARLY_UP], b=NOISE)
    assert decide(H_UP, family, {}).verdict == "contradicted"
    noisy = decide(Hypothesis("H", "c", "held_out", "b", "higher"), family, {})
    assert noisy.verdict == "undecided"
    # What the seeds could have detected: paired t at 80% power, level alpha / 2 (two methods in the family).
    from tepo.compare.power import detectable_paired_difference

    sd = float(__import__("statistics").stdev(NOISE))
    assert noisy.detectable == pytest.approx(detectable_paired_difference(sd, 10, alpha=0.025))


def test_holm_across_the_family_can_turn_a_nominal_p_into_undecided():
    # 8 of 10 seeds higher: sign-flip p = 0.023 alone, but Holm over 3 methods makes it 0.07
    eight_up = [0.1] * 8 + [-0.05, -0.06]
    family = _family(a=eight_up, b=NOISE, c=NOISE)
    verdict = decide(H_UP, family, {})
    assert verdict.p < 0.05 <= verdict.p_holm
    assert verdict.verdict == "undecided"


H2 = Hypothesis("H2", "half the steps", "steps_to_share", "v2", "lower", relative_change=-0.5)
REFERENCE_STEPS = dict.fromkeys(SEEDS, 10.0)  # the reference needs 10 steps on every seed: the claim is -5


def test_a_size_claim_needs_significance_and_the_claimed_size():
    halved = _family(v2=[-5.0, -6.0, -5.0, -7.0, -5.0, -5.0, -6.0, -5.0, -5.0, -6.0])
    verdict = decide(H2, halved, REFERENCE_STEPS)
    assert verdict.claimed == pytest.approx(-5.0)
    assert verdict.verdict == "supported"
    # Significantly faster but by 2-3 steps of 10, with -5 inside the interval? no: the interval excludes it.
    short = decide(
        H2, _family(v2=[-2.0, -3.0, -2.0, -3.0, -2.0, -2.0, -3.0, -2.0, -3.0, -2.0]), REFERENCE_STEPS
    )
    assert short.high < 0 and short.low > -5.0
    assert short.verdict == "contradicted"  # a 50% reduction lies outside the interval


def test_a_size_claim_inside_a_wide_interval_is_undecided_even_when_significant():
    # Significantly lower (every seed), mean -4 short of -5, but -5 inside the interval: undecided.
    wide = [-1.0, -8.0, -2.0, -7.0, -1.0, -6.0, -3.0, -5.0, -2.0, -5.0]
    verdict = decide(H2, _family(v2=wide), REFERENCE_STEPS)
    assert verdict.low < -5.0 < verdict.mean < 0 and verdict.p_holm < 0.05
    assert verdict.verdict == "undecided" and "falls short" in verdict.reason


def test_a_size_claim_against_a_method_that_is_slower_is_contradicted():
    slower = decide(H2, _family(v2=[1.0, 2.0, 1.0, 3.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0]), REFERENCE_STEPS)
    assert slower.verdict == "contradicted"


def test_the_claimed_size_is_taken_over_the_paired_seeds_only():
    # Seeds 0-4 are paired; the reference's unpaired seeds (100 steps) must not move the claim.
    cell = paired_cell({s: -5.0 - 0.1 * s for s in range(5)})
    add_holm([cell])
    reference = {**dict.fromkeys(range(5), 10.0), **dict.fromkeys(range(5, 10), 100.0)}
    assert decide(H2, {"v2": cell}, reference).claimed == pytest.approx(-5.0)


def test_one_pair_gives_no_interval_and_says_so():
    verdict = decide(H2, _family(v2=[-6.0]), REFERENCE_STEPS)
    assert verdict.n == 1 and verdict.low is None
    assert verdict.verdict == "undecided" and "one pair, no interval" in verdict.reason


def test_a_method_without_pairs_is_not_tested():
    cell = paired_cell({})
    add_holm([cell])
    assert decide(H_UP, {"a": cell}, {}).verdict == "not tested"


def _write(tmp_path, data) -> Path:
    path = tmp_path / "hypotheses.yaml"
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


GOOD = {"id": "H1", "claim": "c", "measure": "held_out", "method": "tepo", "expect": "higher"}


@pytest.mark.parametrize(
    "entry, message",
    [
        ({**GOOD, "expect": "up"}, "hypotheses[0]: expect: expected higher or lower, got 'up'"),
        ({**GOOD, "method": ""}, "hypotheses[0]: method: expected a non-empty string"),
        ({**GOOD, "relative_change": "half"}, "hypotheses[0]: relative_change: expected a number"),
        ({**GOOD, "relative_change": -0.5}, "points against expect 'higher'"),
        ({**GOOD, "measur": "x"}, "hypotheses[0]: unknown fields ['measur']"),
    ],
)
def test_a_bad_entry_is_refused_naming_the_file_the_entry_and_the_field(tmp_path, entry, message):
    path = _write(tmp_path, {"hypotheses": [entry]})
    with pytest.raises(HypothesisError, match=__import__("re").escape(message)) as err:
        read_hypotheses(path)
    assert str(path) in str(err.value)


def test_a_file_without_hypotheses_or_with_duplicate_ids_is_refused(tmp_path):
    with pytest.raises(HypothesisError, match="non-empty list under 'hypotheses'"):
        read_hypotheses(_write(tmp_path, {"alpha": 0.05}))
    with pytest.raises(HypothesisError, match="ids must be unique"):
        read_hypotheses(_write(tmp_path, {"hypotheses": [GOOD, GOOD]}))
    with pytest.raises(HypothesisError, match="alpha: expected a number in"):
        read_hypotheses(_write(tmp_path, {"alpha": 5, "hypotheses": [GOOD]}))


def test_a_measure_or_method_the_table_lacks_is_refused_naming_what_it_has():
    rows = [{"method": "grpo"}, {"method": "tepo"}]
    table = {"paired": {"held_out": {"tepo": {"n": 0}}}, "rows": rows, "convergence": {"reference": "grpo"}}
    with pytest.raises(HypothesisError, match="measure 'entropy' is not paired in this table"):
        decide_all(table, [Hypothesis("H", "c", "entropy", "tepo", "higher")])
    with pytest.raises(HypothesisError, match=r"method 'sapo' is not compared in this table \(tepo\)"):
        decide_all(table, [Hypothesis("H", "c", "held_out", "sapo", "higher")])


def test_a_planned_method_without_a_finished_run_is_not_tested_yet():
    table = {
        "paired": {"held_out": {"tepo": {"n": 0}}},
        "rows": [{"method": "grpo", "per_seed": {}}, {"method": "tepo", "per_seed": {}}],
        "missing_runs": ["tepo_v2/seed0", "tepo_v2/seed1"],
        "convergence": {"reference": "grpo"},
    }
    (verdict,) = decide_all(table, [Hypothesis("H2", "c", "held_out", "tepo_v2", "higher")])
    assert verdict.verdict == "not tested" and verdict.n == 0
    with pytest.raises(HypothesisError, match="method 'grpo' is not compared"):  # the reference itself
        decide_all(table, [Hypothesis("H", "c", "held_out", "grpo", "higher")])


def test_the_study_of_this_repository_registers_its_plans_four_hypotheses():
    hypotheses, alpha = read_hypotheses(RESULTS / "tepo-decided" / "hypotheses.yaml")
    assert alpha == 0.05
    registered = {(h.id, h.measure, h.method, h.expect, h.relative_change) for h in hypotheses}
    assert registered == {
        ("H1", "held_out", "tepo", "higher", None),
        ("H2", "steps_to_share", "tepo_v2_kl_mask", "lower", -0.5),
        ("H3", "grad_norm_cv", "tepo", "lower", None),
        ("H4", "entropy_kept", "tepo", "higher", None),
    }


def _compare_table_only(study: Path, hypotheses: Path, capsys) -> tuple[int, str, str]:
    from tepo.cli import main

    code = main(
        ["compare", "--table-only", "--dir", str(study), "--no-report", "--hypotheses", str(hypotheses)]
    )
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_tepo_compare_decides_hypotheses_on_a_committed_study(tmp_path, capsys):
    study = tmp_path / "study"
    shutil.copytree(RESULTS / "tepo-offpolicy", study, ignore=shutil.ignore_patterns("report"))
    path = _write(tmp_path, {"hypotheses": [GOOD, {**GOOD, "id": "H4", "measure": "entropy_kept"}]})
    code, out, err = _compare_table_only(study, path, capsys)
    assert code == 0, err
    written = (study / "verdicts.md").read_text()
    assert written in out
    # Three seeds: the smallest exact sign-flip p is 2/8 = 0.25, so nothing can be decided; the file says so.
    assert written.count("**undecided**") == 2
    bad = _write(tmp_path, {"hypotheses": [{**GOOD, "method": "sapo_x"}]})
    code, _, err = _compare_table_only(study, bad, capsys)
    assert code == 2 and "method 'sapo_x' is not compared in this table" in err


def test_a_held_out_verdict_carries_the_problem_level_view_and_other_measures_do_not():
    view = {"seeds": [0, 1], "problems": 3, "only_method": 2, "only_reference": 1, "both": 2, "neither": 1}
    view |= {"mean": 1 / 6, "low": -0.25, "high": 0.5, "interval": "two-way bootstrap"}
    table = {
        "paired": {"held_out": _family(tepo=CLEARLY_UP), "grad_norm_cv": _family(tepo=NOISE)},
        "rows": [{"method": "grpo", "per_seed": {}}, {"method": "tepo", "per_seed": {}}],
        "convergence": {"reference": "grpo"},
        "problem_level": {"tepo": view},
    }
    h1 = Hypothesis("H1", "c", "held_out", "tepo", "higher")
    h3 = Hypothesis("H3", "c", "grad_norm_cv", "tepo", "lower")
    first, third = decide_all(table, [h1, h3])
    assert first.verdict == "supported" and first.problems == view  # beside the verdict, not part of its rule
    assert third.problems is None
    text = render_verdicts([first, third], "grpo")
    assert (
        "- H1: tepo against grpo on 3 problems x 2 seeds (6 pairs): only tepo solved 2, only grpo 1" in text
    )
    assert "+0.167 [-0.250, +0.500]" in text and "H3: tepo against" not in text


def test_the_cli_puts_the_problem_level_view_of_real_records_beside_the_verdict(tmp_path, capsys):
    """The pilot's 8-update setting (one seed, per-problem records of 100 held-out problems per run)."""
    study = tmp_path / "u8"
    shutil.copytree(RESULTS / "tepo-decided" / "pilot" / "u8", study)
    path = _write(tmp_path, {"hypotheses": [{**GOOD, "id": "H1", "measure": "held_out", "method": "tepo"}]})
    code, out, err = _compare_table_only(study, path, capsys)
    assert code == 0, err
    verdicts = (study / "verdicts.md").read_text()
    assert verdicts in out
    line = next(x for x in verdicts.splitlines() if x.startswith("- H1: tepo against grpo"))
    assert "on 100 problems x 1 seeds (100 pairs)" in line
    counts = [int(n) for n in re.findall(r"(?:solved|grpo|both|neither) (\d+)", line)]
    assert len(counts) == 4 and sum(counts) == 100  # every (seed, problem) pair counted once
    saved = json.loads((study / "verdicts.json").read_text())["verdicts"][0]["problems"]
    assert saved["problems"] == 100 and saved["only_method"] == counts[0]
