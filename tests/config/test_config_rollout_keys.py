"""The rollout section's sub-configs (rollout.hf, rollout.vllm, rollout.parity) and the flat names they replaced
(rollout.vllm_dtype, rollout.parity_check, ...): every old name is still read, from the command line, a YAML file
or a saved run's config.yaml, lands in its new place with one deprecation line, and the committed study runs still
load and match their comparison's plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tepo.compare.planning import plan_comparison
from tepo.compare.runner import _config_differences, run_comparison
from tepo.config import (
    RENAMED_KEYS,
    ConfigError,
    RunConfig,
    config_warnings,
    load_config,
    save_config,
)
from tepo.config.schema import ROLLOUT_FLAT_KEYS

ROOT = Path(__file__).resolve().parents[2]

# One non-default value per old flat key, and where it must land.
OLD_VALUES = {
    "hf_max_batch_size": 4,
    "vllm_python": "/opt/vllm/bin/python",
    "vllm_dtype": "float32",
    "vllm_kv_cache_gb": 0.5,
    "vllm_gpu_memory_utilization": 0.4,
    "vllm_max_model_len": 2048,
    "parity_check": False,
    "parity_max_gap": 0.25,
    "parity_min_shift": 0.1,
    "parity_min_share": 0.6,
}


def _new_value(config: RunConfig, old: str):
    section, key = ROLLOUT_FLAT_KEYS[old]
    return getattr(getattr(config.rollout, section), key)


def _deprecation_lines(config: RunConfig) -> list[str]:
    return [note for note in config_warnings(config) if "deprecated" in note]


def test_every_old_flat_key_has_a_new_place_and_a_test_value():
    assert set(OLD_VALUES) == set(ROLLOUT_FLAT_KEYS)
    for old, (section, key) in ROLLOUT_FLAT_KEYS.items():
        assert RENAMED_KEYS[f"rollout.{old}"] == f"rollout.{section}.{key}"
        assert key in RunConfig().to_dict()["rollout"][section]
        assert old not in RunConfig().to_dict()["rollout"]


@pytest.mark.parametrize("old", sorted(OLD_VALUES))
def test_an_old_key_on_the_command_line_lands_in_its_new_place_with_one_note(old):
    value = OLD_VALUES[old]
    config = load_config(None, [f"rollout.{old}={json.dumps(value)}"])
    assert _new_value(config, old) == value
    section, key = ROLLOUT_FLAT_KEYS[old]
    assert _deprecation_lines(config) == [
        f"rollout.{old} in the overrides is deprecated: rename it rollout.{section}.{key} "
        f"(read as rollout.{section}.{key}={value!r} there)"
    ]
    # The old name still reads, as a read-only attribute, for code written before the move.
    assert getattr(config.rollout, old) == value


def test_the_cpu_trap_line_under_its_old_and_new_name():
    old = load_config(None, ["rollout.vllm_dtype=float32"])
    new = load_config(None, ["rollout.vllm.dtype=float32"])
    assert old.to_dict() == new.to_dict() and new.rollout.vllm.dtype == "float32"
    assert len(_deprecation_lines(old)) == 1 and _deprecation_lines(new) == []


def test_old_keys_in_a_yaml_file_land_in_their_new_places_with_one_line_for_the_file(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump({"rollout": {"group_size": 4, **OLD_VALUES}}))
    config = load_config(str(path))
    assert config.rollout.group_size == 4
    assert {old: _new_value(config, old) for old in OLD_VALUES} == OLD_VALUES
    (line,) = _deprecation_lines(config)
    assert line.startswith(f"deprecated key names in {path}, read under their new names: ")
    for old, (section, key) in ROLLOUT_FLAT_KEYS.items():
        assert f"rollout.{old} -> rollout.{section}.{key}" in line


def _write_flat_config(config: RunConfig, path: Path, values: dict | None = None) -> None:
    """``config`` as save_config wrote it before the move: every rollout key flat (``values`` replace some); keys
    born after the move (rollout.parity.every, rollout.vllm.compile,
    rollout.vllm.block_size) are left out, as such a file would not have them."""
    data = config.to_dict()
    rollout = data["rollout"]
    for old, (section, key) in ROLLOUT_FLAT_KEYS.items():
        rollout[old] = rollout[section].pop(key)
        if values and old in values:
            rollout[old] = values[old]
    born_later = {"parity": {"every"}, "vllm": {"compile", "block_size", "keep_weights_file"}}
    for section in ("hf", "vllm", "parity"):
        assert set(rollout.pop(section)) == born_later.get(section, set())
    data["optim"]["betas"] = list(data["optim"]["betas"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def test_a_saved_flat_config_yaml_loads_with_one_line_and_is_saved_under_the_new_names(tmp_path):
    """A run directory written before the move (every rollout key flat, as save_config wrote them) resumes."""
    saved = tmp_path / "run" / "config.yaml"
    _write_flat_config(RunConfig(), saved, OLD_VALUES)

    config = load_config(str(saved))
    assert {old: _new_value(config, old) for old in OLD_VALUES} == OLD_VALUES
    assert len(_deprecation_lines(config)) == 1
    # An override on resume, in either name, beats the saved value.
    assert load_config(str(saved), ["rollout.vllm.dtype=bfloat16"]).rollout.vllm.dtype == "bfloat16"
    assert load_config(str(saved), ["rollout.vllm_dtype=bfloat16"]).rollout.vllm.dtype == "bfloat16"
    # Saved again (tepo train --resume with overrides rewrites config.yaml): the new names, no more notes.
    save_config(config, tmp_path / "again.yaml")
    rewritten = yaml.safe_load((tmp_path / "again.yaml").read_text())["rollout"]
    assert not set(ROLLOUT_FLAT_KEYS) & set(rewritten)
    assert rewritten["vllm"]["dtype"] == "float32" and rewritten["parity"]["check"] is False
    again = load_config(str(tmp_path / "again.yaml"))
    assert again.to_dict() == config.to_dict() and _deprecation_lines(again) == []


def test_the_note_survives_the_precision_resolution_so_the_trainer_prints_it():
    from tepo.precision import resolve_run_precision

    config = load_config(None, ["rollout.parity_check=false"])
    resolved = resolve_run_precision(config, "cpu").config
    assert resolved.rollout.parity.check is False
    assert _deprecation_lines(resolved) == _deprecation_lines(config) and len(_deprecation_lines(config)) == 1


def test_an_old_key_and_its_new_name_with_different_values_is_one_clear_error():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["rollout.vllm_dtype=float32", "rollout.vllm.dtype=bfloat16"])
    lines = [line for line in str(err.value).splitlines() if "rollout.vllm" in line]
    assert lines == [
        "  - rollout.vllm_dtype and rollout.vllm.dtype in the overrides differ ('float32' and 'bfloat16'): "
        "rollout.vllm_dtype is the deprecated name of rollout.vllm.dtype; give only rollout.vllm.dtype"
    ]
    # The same value under both names is no conflict: read once, one note.
    same = load_config(None, ["rollout.parity_max_gap=0.3", "rollout.parity.max_gap=0.3"])
    assert same.rollout.parity.max_gap == 0.3 and len(_deprecation_lines(same)) == 1


def test_names_in_different_layers_do_not_conflict_the_later_layer_wins(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("rollout: {vllm_dtype: float32, parity_max_gap: 0.3}\n")
    child = tmp_path / "child.yaml"
    child.write_text(f"base: {base}\nrollout: {{vllm: {{dtype: bfloat16}}}}\n")
    config = load_config(str(child))
    assert (config.rollout.vllm.dtype, config.rollout.parity.max_gap) == ("bfloat16", 0.3)
    assert len(_deprecation_lines(config)) == 1 and str(base) in _deprecation_lines(config)[0]
    assert load_config(str(base), ["rollout.vllm.dtype=bfloat16"]).rollout.vllm.dtype == "bfloat16"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "rollout.vllm.dtype=int8",
            "rollout.vllm.dtype: expected auto, bfloat16, float16 or float32, got 'int8'",
        ),
        ("rollout.vllm.kv_cache_gb=0", "rollout.vllm.kv_cache_gb: must be > 0, got 0.0"),
        (
            "rollout.vllm.gpu_memory_utilization=1",
            "rollout.vllm.gpu_memory_utilization: must be in (0, 1), got 1.0",
        ),
        ("rollout.vllm.max_model_len=0", "rollout.vllm.max_model_len: must be >= 1, got 0"),
        ("rollout.parity.max_gap=0", "rollout.parity.max_gap: must be > 0, got 0.0"),
        ("rollout.parity.min_shift=-1", "rollout.parity.min_shift: must be > 0, got -1.0"),
        ("rollout.parity.min_share=1", "rollout.parity.min_share: must be in (0, 1), got 1.0"),
        ("rollout.parity.every=0", "rollout.parity.every: must be an integer >= 1, got 0"),
        (
            "rollout.hf.max_batch_size=0",
            "rollout.hf.max_batch_size: must be >= 1 (or null for all rows at once)",
        ),
        ("rollout.parity.check=maybe", "rollout.parity.check: expected bool, got 'maybe'"),
        ("rollout.vllm.nope=1", "unknown key 'rollout.vllm.nope'"),
        # An old name's value is checked under its new name.
        ("rollout.parity_min_share=2", "rollout.parity.min_share: must be in (0, 1), got 2.0"),
    ],
)
def test_the_new_keys_are_validated_under_their_new_names(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert message in str(err.value)


def test_a_finished_run_with_a_flat_config_is_reused_by_tepo_compare(tmp_path):
    """`tepo compare` matches runs by config: a run saved with the flat names is the planned run, not a stranger."""
    plan = plan_comparison(tmp_path, ["grpo"], [0], overrides=["train.steps=2"], check_prompts=False)
    (spec,) = plan.runs
    _write_flat_config(spec.config, spec.run_dir / "config.yaml")
    (spec.run_dir / "summary.json").write_text(json.dumps({"after": {"eval_greedy_accuracy": 0.5}}))

    def never(*args, **kwargs):
        raise AssertionError("a matching finished run must be reused, not trained")

    outcomes = run_comparison(plan, train_fn=never, resume_fn=never, log=lambda *a: None)
    assert [o.action for o in outcomes] == ["reused"]
    # A flat config that differs in a moved key is still told apart, under the key's new name.
    other = tmp_path / "other" / "config.yaml"
    _write_flat_config(spec.config, other, {"parity_max_gap": 0.25})
    assert _config_differences(load_config(str(other)), spec.config) == ["rollout.parity.max_gap"]


STUDIES = sorted((ROOT / "docs" / "results").glob("*/comparison.json"))


@pytest.mark.parametrize("plan_file", STUDIES, ids=[p.parent.name for p in STUDIES])
def test_the_committed_study_runs_load_and_match_their_plan(plan_file, monkeypatch):
    """Their older config.yaml files use the flat names; `tepo compare` must still see them as the planned runs
    (it refuses a run directory whose settings differ, and would retrain it). Each run the plan records is planned
    again from the repository root, as it was (train.output_dir is the relative comparison directory); a planned
    run not committed yet (a study still growing) is left out."""
    monkeypatch.chdir(ROOT)
    saved_plan = json.loads(plan_file.read_text())
    recorded = [(m, int(seed)) for m, seeds in saved_plan["runs"].items() for seed in seeds]
    flat = 0
    for method, seed in recorded:
        (spec,) = plan_comparison(
            plan_file.parent.relative_to(ROOT),
            [method],
            [seed],
            config=saved_plan["base_config"],
            overrides=saved_plan["overrides"],
            check_prompts=False,
            eval_seed=None,  # these studies scored each seed on its own held-out draw (--eval-seed none)
        ).runs
        path = spec.run_dir / "config.yaml"
        if not path.exists():
            continue
        saved = load_config(str(path))
        assert _config_differences(saved, spec.config) == [], spec.run_dir
        written_flat = "vllm_dtype" in path.read_text()  # written before the keys moved
        flat += written_flat
        assert len(_deprecation_lines(saved)) == int(written_flat), spec.run_dir
    assert flat >= 6, "the older runs, with the flat names, are still read"
