"""Metric names grouped by phase (tepo.metrics.catalogue): every key the step and the trainer write is grouped where
it is computed and catalogued, the log writes rows as they come, and old flat logs read with the grouped names
through the reading map (tepo.metrics.names)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from loss_cases import registered_loss_metrics
from tepo.config import load_config
from tepo.losses import POLICY_LOSSES
from tepo.metrics import MetricsLog, read_metrics
from tepo.metrics.catalogue import GROUPS, LOGGED, in_group, ungrouped
from tepo.metrics.names import FLAT_NAMES, NAMES, canonical, flat_name, metric_name

REPO = Path(__file__).resolve().parents[2]


def _committed_logs() -> list[Path]:
    files = subprocess.run(
        ["git", "ls-files", "*metrics*.jsonl"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    return [REPO / f for f in files]


def test_the_table_is_one_to_one_and_grouped():
    assert len(FLAT_NAMES) == len(NAMES), "two flat names share a grouped name"
    for flat, grouped in NAMES.items():
        assert "/" not in flat and grouped.split("/")[0] in GROUPS, (flat, grouped)
        assert metric_name(flat) == grouped and flat_name(grouped) == flat
    assert metric_name("step") == "step" and metric_name("reward/format_mean") == "reward/format_mean"
    assert NAMES["reward_mean"] == "reward/mean" and NAMES["clip_frac_high"] == "update/clip_frac_high"


def test_the_old_logs_read_into_catalogued_names():
    assert set(NAMES.values()) <= set(LOGGED)
    assert len(LOGGED) == len(set(LOGGED)) and all(name.split("/")[0] in GROUPS for name in LOGGED)


def test_a_row_is_written_as_it_comes_and_read_back_the_same(tmp_path):
    row = {"step": 1, "reward/mean": 0.5, "update/clip_frac_high": 0.0, "reward/format_mean": 1.0}
    log = MetricsLog(tmp_path)
    log.append(row)
    log.close()
    (line,) = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(line) == row and list(json.loads(line)) == list(row)
    assert read_metrics(tmp_path / "metrics.jsonl") == [row]
    assert canonical(row) == row  # reading a new log changes nothing


def test_in_group_names_a_functions_own_metrics():
    assert in_group("update", {"clip_frac_high": 0.1}) == {"update/clip_frac_high": 0.1}
    assert in_group("parity", {"parity_gap": 0.2}, drop_prefix="parity_") == {"parity/gap": 0.2}
    assert in_group("mismatch", {"mismatch_kl_k3": 0.3}, drop_prefix="mismatch_") == {"mismatch/kl_k3": 0.3}
    with pytest.raises(ValueError, match="unknown metric group 'updates'"):
        in_group("updates", {"loss": 1.0})
    # The names a phase gives a library function's metrics are those the reading map gives the old flat ones.
    for flat in (
        "clip_frac_high",
        "kl_ref",
        "entropy_mean",
        "parity_gap",
        "mismatch_kl_k3",
        "is_weight_mean",
    ):
        group = NAMES[flat].split("/")[0]
        prefix = {"parity": "parity_", "mismatch": "mismatch_"}.get(group, "")
        assert in_group(group, {flat: 0}, drop_prefix=prefix) == {NAMES[flat]: 0}


def test_an_old_flat_log_reads_as_a_new_one(tmp_path):
    old = {
        "step": 3,
        "reward_mean": 0.25,
        "step_seconds": 9.5,
        "eval_greedy_accuracy": 0.5,
        "parity_gap": 0.1,
    }
    (tmp_path / "metrics.jsonl").write_text(json.dumps(old) + "\n")
    (row,) = read_metrics(tmp_path / "metrics.jsonl")
    assert row == {
        "step": 3,
        "reward/mean": 0.25,
        "time/step_seconds": 9.5,
        "eval/greedy_accuracy": 0.5,
        "parity/gap": 0.1,
    }


def test_every_key_of_the_committed_study_runs_is_placed():
    logs = _committed_logs()
    assert len(logs) >= 40, logs  # docs/results/* and tests/fixtures/compare
    for path in logs:
        for line in path.read_text().splitlines():
            row = json.loads(line)
            assert not ungrouped(canonical(row)), (path, ungrouped(canonical(row)))


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_every_registered_loss_logs_placed_metrics(name):
    metrics = registered_loss_metrics(name)
    logged = in_group("update", metrics)  # as the update logs them
    assert not ungrouped(logged), f"{name}: {ungrouped(logged)}"
    # Each of the built-in losses' metrics reads the same from a log written before the grouping.
    assert all(metric_name(key) == f"update/{key}" for key in metrics if key in NAMES), name


@pytest.mark.model
def test_a_training_run_logs_only_grouped_names(tmp_path, tiny_model_dir):
    """Two real steps on a tiny model with most optional metrics on (evaluation every step, a reference model,
    a rollout correction, overlong shaping, two reward functions): every key the step and the trainer write is
    grouped, as the reading map would name it, and the log holds no flat name."""
    from tepo.training import train

    config = load_config(
        "default",
        [
            f"model.name={tiny_model_dir}",
            "rollout.backend=hf",
            f"train.output_dir={tmp_path}",
            "train.run_name=names",
            "train.steps=2",
            "train.prompts_per_step=2",
            "rollout.group_size=2",
            "rollout.max_new_tokens=4",
            "eval.size=2",
            "eval.every=1",
            "eval.samples=2",
            "algorithm.kl_coef=0.01",
            "algorithm.rollout_correction=tis",
            "reward.overlong_buffer=2",
            "reward.functions=[{name: correctness, weight: 1.0}, {name: format, weight: 0.5}]",
            "train.save_every=0",
            "train.save_final=false",
            "reward.num_workers=1",
            "log.progress=false",
        ],
    )
    run_dir = train(config, log=lambda *_: None).run_dir
    raw = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in raw] == [1, 2]
    keys = {k for row in raw for k in row}
    assert not ungrouped(keys), f"name {ungrouped(keys)} in their group where they are computed"
    assert not keys & set(NAMES), "a flat name was written"
    # ... and catalogued (each reward function's mean aside: a pattern).
    per_function = {k for k in keys if k.startswith("reward/") and k.endswith("_mean")}
    assert keys - {"step"} - per_function <= set(LOGGED)
    for expected in ("reward/mean", "update/grad_norm", "time/step_seconds", "eval/greedy_accuracy"):
        assert expected in keys
    assert {"mismatch/kl_k3", "mismatch/is_weight_mean", "update/kl_ref", "reward/format_mean"} <= keys
