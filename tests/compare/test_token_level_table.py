"""scripts/token_level_table.py: the share of all-equal groups and of their advantaged tokens, read from a run's log."""

from __future__ import annotations

import json

from helpers import load_script


def _run(directory, method, seed, steps):
    run = directory / method / f"seed{seed}"
    run.mkdir(parents=True)
    (run / "summary.json").write_text("{}")
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in steps))


def test_the_table_averages_the_all_equal_shares_from_step_two(tmp_path, capsys):
    values = {"held_out": 0.5, "sampled": 0.25, "pass@1": 0.2, "pass@8": 0.6, "entropy_kept": 0.4}
    table = {
        "rows": [
            {"method": "grpo", "per_seed": {"3": values}},
            {"method": "ep_grpo", "per_seed": {"3": values | {"held_out_delta": -0.125, "pass@8": 0.5}}},
        ]
    }
    (tmp_path / "table.json").write_text(json.dumps(table))
    _run(
        tmp_path, "grpo", 3, [{"step": s, "update/grad_norm": 0.0} for s in (1, 2)]
    )  # nothing all-equal logged
    _run(
        tmp_path,
        "ep_grpo",
        3,
        [
            # step 1 (old == ref) is left out of the advantaged share; step 3 had no all-equal group
            {"step": 1, "reward/frac_groups_all_equal": 1.0, "reward/frac_all_equal_tokens_advantaged": 0.0,
             "update/grad_norm": 0.0},
            {"step": 2, "reward/frac_groups_all_equal": 0.5, "reward/frac_all_equal_tokens_advantaged": 1.0,
             "update/grad_norm": 1.5},
            {"step": 3, "reward/frac_groups_all_equal": 0.0, "reward/frac_all_equal_tokens_advantaged": 0.0,
             "update/grad_norm": 2.0},
            {"step": 4, "reward/frac_groups_all_equal": 0.25, "reward/frac_all_equal_tokens_advantaged": 0.5,
             "update/grad_norm": 1.0},
        ],
    )  # fmt: skip
    script = load_script("token_level_table")
    assert script.main([str(tmp_path), "--methods", "grpo,ep_grpo,erpo", "--seeds", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "| `grpo` | 3 | 0.500 | - | 0.250 | 0.200 | 0.600 | 0.400 | 0.00 | - | 2 |"
    # all-equal share (1 + 0.5 + 0 + 0.25) / 4; advantaged (1 + 0.5) / 2 over steps 2 and 4; one zero-gradient step
    assert lines[3] == "| `ep_grpo` | 3 | 0.500 | -0.125 | 0.250 | 0.200 | 0.500 | 0.400 | 0.44 | 0.75 | 1 |"
    assert len(lines) == 4, "a method without a finished run (erpo) has no row"


def test_several_seeds_end_each_method_with_its_mean(tmp_path, capsys):
    table = {
        "rows": [
            {"method": "grpo", "per_seed": {"3": {"held_out": 0.5, "sampled": 0.25, "entropy_kept": 0.4},
                                            "4": {"held_out": 0.25, "sampled": 0.5, "entropy_kept": 0.2}}},
            {"method": "erpo", "per_seed": {"3": {"held_out": 0.75, "sampled": 0.5, "entropy_kept": 0.6,
                                                  "held_out_delta": 0.25},
                                            "4": {"held_out": 0.25, "sampled": 0.5, "entropy_kept": 0.6,
                                                  "held_out_delta": 0.0}}},
        ]
    }  # fmt: skip
    (tmp_path / "table.json").write_text(json.dumps(table))
    _run(tmp_path, "grpo", 3, [{"step": 1, "update/grad_norm": 0.0}, {"step": 2, "update/grad_norm": 1.0}])
    _run(tmp_path, "grpo", 4, [{"step": 1, "update/grad_norm": 1.0}, {"step": 2, "update/grad_norm": 1.0}])
    _run(tmp_path, "erpo", 3, [{"step": 1, "update/grad_norm": 1.0}])
    _run(tmp_path, "erpo", 4, [{"step": 1, "update/grad_norm": 1.0}])
    script = load_script("token_level_table")
    assert script.main([str(tmp_path), "--methods", "grpo,erpo", "--seeds", "3,4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert (
        lines[2:]
        == [
            "| `grpo` | 3 | 0.500 | - | 0.250 | - | - | 0.400 | 0.00 | - | 1 |",
            "| `grpo` | 4 | 0.250 | - | 0.500 | - | - | 0.200 | 0.00 | - | 0 |",
            # (0.5 + 0.25) / 2, (0.25 + 0.5) / 2, (0.4 + 0.2) / 2; half a zero-gradient step per run
            "| `grpo` | **mean of 2** | 0.375 | - | 0.375 | - | - | 0.300 | 0.00 | - | 0.5 |",
            "| `erpo` | 3 | 0.750 | +0.250 | 0.500 | - | - | 0.600 | 0.00 | - | 0 |",
            "| `erpo` | 4 | 0.250 | +0.000 | 0.500 | - | - | 0.600 | 0.00 | - | 0 |",
            "| `erpo` | **mean of 2** | 0.500 | +0.125 | 0.500 | - | - | 0.600 | 0.00 | - | 0 |",  # a whole mean count
        ]
    )
