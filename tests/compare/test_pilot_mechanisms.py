"""scripts/pilot_mechanisms.py: the mechanism table of a pilot, from hand-made run directories."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import load_script


def _run(run_dir: Path, rows: list[dict], before: float, after: float) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text("{}\n")
    (run_dir / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": i + 1, **r}) + "\n" for i, r in enumerate(rows))
    )
    (run_dir / "eval_before.json").write_text(json.dumps({"eval_greedy_accuracy": before}))
    (run_dir / "summary.json").write_text(json.dumps({"after": {"eval_greedy_accuracy": after}}))


def test_the_table_of_a_two_setting_pilot(tmp_path, capsys):
    tepo_rows = [
        {"update/optimizer_updates": 4, "update/seq_ratio_p10": 0.99, "update/seq_ratio_p50": 1.0,
         "update/seq_ratio_p90": 1.01, "update/seq_ratio_min": 0.97, "update/seq_ratio_max": 1.05,
         "update/seq_clip_frac_low": 0.0, "update/seq_clip_frac_high": 0.0, "update/clip_frac_low": 0.0,
         "update/clip_frac_high": 0.0, "rollout/frac_truncated": 0.9},
        {"update/optimizer_updates": 4, "update/seq_ratio_p10": 0.98, "update/seq_ratio_p50": 1.0,
         "update/seq_ratio_p90": 1.03, "update/seq_ratio_min": 0.9, "update/seq_ratio_max": 1.25,
         "update/seq_clip_frac_low": 0.0, "update/seq_clip_frac_high": 0.125, "update/clip_frac_low": 0.0,
         "update/clip_frac_high": 0.0625, "rollout/frac_truncated": 0.2},
    ]  # fmt: skip
    _run(tmp_path / "u4" / "tepo" / "seed0", tepo_rows, before=0.3, after=0.4)
    _run(
        tmp_path / "u1" / "grpo" / "seed0",
        [{"update/clip_frac_high": 0.01, "rollout/frac_truncated": 0.6}],
        0.3,
        0.2,
    )
    assert load_script("pilot_mechanisms").main([str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    tepo = next(line for line in out if "| u4 " in line)
    # medians over the steps: p10 (0.99, 0.98) -> 0.985; extremes 0.9 and 1.25; the clip fired on 1 of 2 steps.
    assert "0.985 / 1.000 / 1.020" in tepo and "0.900 / 1.250" in tepo and "0.0625 (1/2 steps)" in tepo
    assert "0.3 -> 0.4".replace("0.3", "0.300").replace("0.4", "0.400") in tepo and tepo.rstrip(
        " |"
    ).endswith("no")
    grpo = next(line for line in out if "| u1 " in line)
    assert "0.0100 (max 0.0100)" in grpo and grpo.rstrip(" |").endswith("yes")  # ended below its start
    assert load_script("pilot_mechanisms").main([str(tmp_path / "missing")]) == 2


def test_per_method_pools_the_seeds_of_one_comparison(tmp_path, capsys):
    def step(p10, fire):
        return {"update/optimizer_updates": 8, "update/seq_ratio_p10": p10, "update/seq_ratio_p50": 1.0,
                "update/seq_ratio_p90": 1.1, "update/seq_ratio_min": p10 - 0.1, "update/seq_ratio_max": 1.2,
                "update/seq_clip_frac_low": 0.0, "update/seq_clip_frac_high": fire,
                "rollout/frac_truncated": 0.1}  # fmt: skip

    _run(tmp_path / "tepo" / "seed0", [step(0.9, 0.0), step(0.8, 0.25)], before=0.3, after=0.4)
    _run(tmp_path / "tepo" / "seed1", [step(0.7, 0.0), step(0.95, 0.0)], before=0.3, after=0.2)
    _run(tmp_path / "grpo" / "seed0", [{"update/clip_frac_high": 0.02}], 0.3, 0.5)
    assert load_script("pilot_mechanisms").main(["--per-method", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    tepo = next(line for line in out if "tepo (2 seeds)" in line)
    # p10 pooled over 4 steps: median of (0.9, 0.8, 0.7, 0.95) = 0.85; min 0.6; fired on 1 of 4 steps, mean 0.0625
    assert "0.850 / 1.000 / 1.100" in tepo and "0.600 / 1.200" in tepo and "0.0625 (1/4 steps)" in tepo
    # held-out medians over the seeds (0.3 -> 0.3), and one of two runs collapsed (seed 1 ended below its start)
    assert "0.300 -> 0.300 (medians)" in tepo and tepo.rstrip(" |").endswith("1/2")
    assert any("grpo (1 seed)" in line for line in out)
