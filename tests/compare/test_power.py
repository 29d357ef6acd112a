"""The detectable paired difference of a study (tepo.compare.power) against printed t tables and its closed form."""

from __future__ import annotations

import math

import pytest

from helpers import load_script
from tepo.compare.power import (
    detectable_paired_difference,
    paired_power_row,
    regularized_incomplete_beta,
    student_t_cdf,
    student_t_quantile,
)


@pytest.mark.parametrize(
    "p, df, table",  # Student's t table values (to 3-6 decimals as printed)
    [
        (0.975, 1, 12.706205),
        (0.975, 2, 4.302653),
        (0.975, 5, 2.570582),
        (0.8, 5, 0.919544),
        (0.95, 10, 1.812461),
    ],
)
def test_t_quantiles_equal_the_printed_table(p, df, table):
    assert student_t_quantile(p, df) == pytest.approx(table, abs=2e-6)
    assert student_t_quantile(1 - p, df) == pytest.approx(-table, abs=2e-6)


def test_t_cdf_closed_forms():
    # df = 1 is the Cauchy distribution: F(t) = 1/2 + atan(t)/pi; df = 2: F(t) = 1/2 + t / (2 sqrt(2 + t^2)).
    for t in (-3.0, -0.5, 0.0, 0.7, 4.0):
        assert student_t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-13)
        assert student_t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-13)
    # I_x(1, 1) = x; I_x(a, 1) = x^a.
    assert regularized_incomplete_beta(1, 1, 0.3) == pytest.approx(0.3, abs=1e-14)
    assert regularized_incomplete_beta(2.5, 1, 0.6) == pytest.approx(0.6**2.5, abs=1e-14)


def test_detectable_difference_closed_form_and_shrinking_with_seeds():
    # n = 6: (t_0.975,5 + t_0.8,5) * sd / sqrt(6) = (2.570582 + 0.919544) * 0.1 / 2.449490 = 0.142483.
    assert detectable_paired_difference(0.1, 6) == pytest.approx(0.142483, abs=1e-6)
    values = [detectable_paired_difference(0.1, n) for n in (2, 3, 6, 12)]
    assert values == sorted(values, reverse=True)
    with pytest.raises(ValueError, match="at least 2 seeds"):
        detectable_paired_difference(0.1, 1)


def test_paired_power_row_and_the_script(tmp_path, capsys):
    # n = 3: (t_0.975,2 + t_0.8,2) * 0.1 / sqrt(3) = (4.302653 + 1.060660) * 0.1 / 1.732051 = 0.309651.
    row = paired_power_row([-0.1, -0.3, -0.2], seeds=[6])
    assert row["n"] == 3 and row["mean"] == pytest.approx(-0.2) and row["sd"] == pytest.approx(0.1)
    assert row["detectable"] == {3: pytest.approx(0.309651, abs=1e-6), 6: pytest.approx(0.142483, abs=1e-6)}
    table = {
        "convergence": {"reference": "grpo"},
        "rows": [
            {"method": "grpo", "per_seed": {"0": {"held_out": 0.5}, "1": {"held_out": 0.4}}},
            {
                "method": "tepo",
                "per_seed": {str(s): {"held_out_delta": d} for s, d in enumerate([-0.1, -0.3, -0.2])},
            },
        ],
    }
    (tmp_path / "table.json").write_text(__import__("json").dumps(table))
    assert load_script("study_power").main([str(tmp_path), "--seeds", "6"]) == 0
    out = capsys.readouterr().out
    # 3 seeds: the percentile bootstrap interval of the mean spans [min, max] of -0.1, -0.3, -0.2
    assert "| tepo | 3 | 0 / 0 / 3 | -0.200 [-0.300, -0.100] | 0.100 | 0.310 | 0.142 |" in out
    assert "| grpo " not in out


def test_the_script_pairs_any_measure_on_the_seeds_the_table_paired(tmp_path, capsys):
    table = {
        "convergence": {"reference": "grpo"},
        "rows": [
            {
                "method": "grpo",
                "per_seed": {"0": {"pass@8": 0.5}, "1": {"pass@8": 0.6}, "2": {"pass@8": 0.9}, "3": {}},
            },
            {
                "method": "tepo",
                "per_seed": {
                    "0": {"held_out_delta": 0.0, "pass@8": 0.25},  # -0.25
                    "1": {"held_out_delta": 0.0, "pass@8": 0.5},  # -0.10
                    "2": {"pass@8": 0.1},  # not paired by the table (another machine): left out
                    "3": {"held_out_delta": 0.0, "pass@8": 0.7},  # grpo has no pass@8 there: left out
                },
            },
        ],
    }
    (tmp_path / "table.json").write_text(__import__("json").dumps(table))
    assert load_script("study_power").main([str(tmp_path), "--measure", "pass@8"]) == 0
    out = capsys.readouterr().out
    assert "mean Δ pass@8 vs grpo" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("| tepo "))
    # mean of -0.25 and -0.10; sd = 0.15 / sqrt(2) = 0.106
    assert line.startswith("| tepo | 2 | 0 / 0 / 2 | -0.175 [-0.250, -0.100] | 0.106 |"), line


def test_the_direction_of_each_seed_is_counted(tmp_path, capsys):
    # One collapsed reference seed (+0.4) moves the mean above 0; the directions say 1 higher, 1 equal, 2 lower.
    deltas = [0.4, 0.0, -0.0625, -0.125]
    table = {
        "convergence": {"reference": "grpo"},
        "rows": [
            {"method": "grpo", "per_seed": {}},
            {"method": "tepo", "per_seed": {str(s): {"held_out_delta": d} for s, d in enumerate(deltas)}},
        ],
    }
    (tmp_path / "table.json").write_text(__import__("json").dumps(table))
    assert load_script("study_power").main([str(tmp_path)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| tepo "))
    assert line.startswith("| tepo | 4 | 1 / 1 / 2 | +0.053 "), line
    assert load_script("study_power").direction_counts([0.5 - 0.4 - 0.1, 1e-3]) == (
        1,
        1,
        0,
    )  # float noise is 0
