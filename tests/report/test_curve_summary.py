"""scripts/curve_summary.py on the committed tiny comparison fixture, against hand-computed means."""

from __future__ import annotations

from pathlib import Path

from helpers import load_script

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "compare" / "tiny"


def _script():
    return load_script("curve_summary")


def test_means_over_steps_then_seeds(capsys):
    assert _script().main([str(FIXTURE), "reward_mean", "reward_mean@2", "grad_norm"]) == 0
    rows = {line.split("|")[1].strip(): line for line in capsys.readouterr().out.splitlines()[2:4]}
    # grpo rewards: seed 0 0.1/0.2/0.3/0.4 -> 0.25, seed 1 0.1/0.3/0.3/0.5 -> 0.30; at step 2: 0.2 and 0.3.
    assert rows["grpo"] == "| grpo | 2 | 0.275 [0.250, 0.300] | 0.250 [0.200, 0.300] | - |"
    # tepo: 0.2/0.4/0.5/0.6 -> 0.425 and 0.2/0.3/0.5/0.5 -> 0.375; at step 2: 0.4 and 0.3.
    assert rows["tepo"] == "| tepo | 2 | 0.400 [0.375, 0.425] | 0.350 [0.300, 0.400] | - |"


def test_grouped_and_flat_names_read_the_same_old_runs(capsys):
    """The fixture's logs have flat names (written before the grouping): the grouped names read them the same."""
    assert _script().main([str(FIXTURE), "reward/mean", "reward/mean@2", "update/grad_norm"]) == 0
    grouped = capsys.readouterr().out.splitlines()
    assert _script().main([str(FIXTURE), "reward_mean", "reward_mean@2", "grad_norm"]) == 0
    flat = capsys.readouterr().out.splitlines()
    assert grouped[0] == "| method | seeds | reward/mean | reward/mean@2 | update/grad_norm |"
    assert grouped[2:] == flat[2:] and "0.275 [0.250, 0.300]" in grouped[2]


def test_no_finished_runs(tmp_path, capsys):
    assert _script().main([str(tmp_path), "reward_mean"]) == 2
    assert "no finished runs" in capsys.readouterr().err
