"""The detectable paired difference of a study (tepo.compare.power) against printed t tables and its closed form."""

from __future__ import annotations

import pytest

from helpers import load_script
from tepo.compare.power import (
    detectable_paired_difference,
    paired_power_row,
    plan_seeds,
    simulated_power,
    t_test_power,
)


def test_t_test_power_against_a_printed_value_and_the_simulation():
    # Cohen 1988 Table 2.3.5 style check: d = delta / sd = 1, n = 10, two-sided 0.05 -> power 0.80 (0.803).
    assert t_test_power(1.0, 1.0, 10) == pytest.approx(0.803, abs=0.005)
    simulated = simulated_power(1.0, 1.0, 10, simulations=4_000)
    assert simulated["t"] == pytest.approx(0.803, abs=0.03)
    # The sign-flip test cannot reject below 2 / 2^n: at n = 4 its smallest p is 0.125 > 0.05, power 0.
    assert simulated_power(1.0, 0.1, 4)["sign_flip"] == 0.0


def test_plan_seeds_finds_the_smallest_count_with_the_power_asked():
    plan = plan_seeds(0.09, 0.10, comparisons=3)
    n = plan["seeds_t"]
    assert n is not None and t_test_power(0.10, 0.09, n, alpha=0.05 / 3) >= 0.8
    assert t_test_power(0.10, 0.09, n - 1, alpha=0.05 / 3) < 0.8
    assert plan["seeds_sign_flip"] is not None and plan["curve"][plan["seeds_sign_flip"]]["sign_flip"] >= 0.8
    # A spread too wide for the budget: no count up to max_seeds suffices, and the plan says so with None.
    assert plan_seeds(0.5, 0.10, comparisons=10, max_seeds=12)["seeds_t"] is None
    with pytest.raises(ValueError, match="non-zero"):
        plan_seeds(0.1, 0.0)


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
    # 3 seeds: the t interval -0.2 -/+ 4.302653 x 0.1 / sqrt(3) = -0.2 -/+ 0.248414
    assert "| tepo | 3 | 0 / 0 / 3 | -0.200 [-0.448, +0.048] | 0.100 | 0.310 | 0.142 |" in out
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
    assert line.startswith("| tepo | 2 | 0 / 0 / 2 | -0.175 [-1.128, +0.778] | 0.106 |"), line  # t, 1 df


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
