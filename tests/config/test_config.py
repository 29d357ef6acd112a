"""tepo.config: presets, ``base:`` inheritance, overrides, YAML number quirks, saving, validation messages."""

from __future__ import annotations

import pytest
import yaml

from tepo.config import (
    ConfigError,
    list_presets,
    load_config,
    parse_overrides,
    save_config,
    validate,
)


@pytest.mark.parametrize("preset", list_presets())
def test_every_preset_loads_and_validates(preset):
    config = load_config(preset)
    assert validate(config) == []


def test_presets_include_the_documented_ones():
    assert {"default", "tepo", "grpo"} <= set(list_presets())


def test_defaults_equal_the_dataclass_defaults_except_what_the_preset_says():
    with open(_preset_path("default")) as handle:
        raw = yaml.safe_load(handle) or {}
    config = load_config()
    for section, values in raw.items():
        for key, value in values.items():
            got = getattr(getattr(config, section), key)
            assert got == (tuple(value) if isinstance(got, tuple) else value), f"{section}.{key}"


def _preset_path(name):
    from importlib import resources

    return resources.files("tepo.configs") / f"{name}.yaml"


def test_base_inheritance_merges_sections_and_replaces_loss_options(tmp_path):
    parent = tmp_path / "parent.yaml"
    parent.write_text(
        "base: tepo\n"
        "rollout: {group_size: 4, temperature: 0.7}\n"
        "algorithm: {loss_options: {eps: 0.3, agg: token_mean}}\n"
    )
    child = tmp_path / "child.yaml"
    child.write_text(
        f"base: {parent}\nrollout: {{group_size: 6}}\nalgorithm: {{loss_options: {{eps: 0.1}}}}\n"
    )
    config = load_config(str(child))
    assert config.algorithm.loss == "tepo"  # from the preset at the bottom
    assert config.rollout.group_size == 6 and config.rollout.temperature == 0.7  # section merged key by key
    # loss_options is replaced whole: a child that sets eps does not inherit another loss's options.
    assert config.algorithm.loss_options == {"eps": 0.1}
    assert config.train == load_config("tepo").train


def test_circular_base_is_an_error(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(f"base: {b}\n")
    b.write_text(f"base: {a}\n")
    with pytest.raises(ConfigError, match="circular base"):
        load_config(str(a))


def test_overrides_are_yaml_typed_and_dotted():
    config = load_config(
        "tepo",
        [
            "optim.lr=1e-4",  # YAML 1.1 reads this as a string; it is a float here
            "optim.betas=[0.9, 0.95]",
            "train.steps=7",
            "train.run_name=abc",
            "algorithm.loss_options={eps: 0.25}",
            "data.limit=null",
            "model.trust_remote_code=true",
            "eval.source=",
        ],
    )
    assert config.optim.lr == 1e-4 and isinstance(config.optim.lr, float)
    assert config.optim.betas == (0.9, 0.95)
    assert config.train.steps == 7 and config.train.run_name == "abc"
    assert config.algorithm.loss_options == {"eps": 0.25}
    assert config.data.limit is None and config.model.trust_remote_code is True
    assert config.eval.source == ""


def test_yaml_file_scientific_numbers_and_ints_become_floats(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optim: {lr: 1e-4, weight_decay: 0, max_grad_norm: 2}\nreward: {timeout_s: 3}\n")
    config = load_config(str(path))
    assert config.optim.lr == 1e-4 and config.optim.weight_decay == 0.0
    assert all(
        isinstance(v, float) for v in (config.optim.lr, config.optim.max_grad_norm, config.reward.timeout_s)
    )


def test_saved_config_loads_back_identical(tmp_path):
    config = load_config("tepo", ["optim.lr=3e-6", "train.run_name=r", "optim.betas=[0.8, 0.9]"])
    save_config(config, tmp_path / "config.yaml")
    assert load_config(str(tmp_path / "config.yaml")) == config


def test_parse_overrides_builds_a_tree():
    assert parse_overrides(["a.b=1", "a.c=[x, y]", "d=hi"]) == {"a": {"b": 1, "c": ["x", "y"]}, "d": "hi"}
    with pytest.raises(ConfigError, match="expected key=value"):
        parse_overrides(["train.steps"])
    with pytest.raises(ConfigError, match="'train' was already given the value 3"):
        parse_overrides(["train=3", "train.steps=2"])


def test_every_problem_is_reported_at_once_one_line_each():
    with pytest.raises(ConfigError) as err:
        load_config("default", ["train.stepz=3", "rollout.group_size=many", "optim.lr=-1"])
    lines = str(err.value).splitlines()
    assert lines[0] == "invalid configuration:"
    assert len(lines) == 4, lines
    assert any("unknown key 'train.stepz' in preset default" in line for line in lines)
    assert any("rollout.group_size: expected int, got 'many'" in line for line in lines)
    assert any("optim.lr: must be > 0, got -1.0" in line for line in lines)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optim.lr=.nan", "optim.lr: expected a finite float"),
        ("optim.lr=inf", "optim.lr: expected a finite float"),
        ("rollout.temperature=-.inf", "rollout.temperature: expected a finite float"),
        ("train.max_bad_steps=0", "train.max_bad_steps: must be >= 1"),
        ("data.limit=0", "data.limit: must be >= 1"),
        ("train.keep_last=-1", "train.keep_last: must be >= 0"),
        ("optim.max_grad_norm=0", "optim.max_grad_norm: must be > 0"),
        ("optim.betas=[0.9, 1.0]", "optim.betas: each must be in [0, 1)"),
        ("optim.schedule=exp", "optim.schedule: expected constant, cosine or linear"),
        ("rollout.top_p=0", "rollout.top_p: must be in (0, 1]"),
        ("train.steps=true", "train.steps: expected int, got True"),
        ("model.trust_remote_code=yes please", "model.trust_remote_code: expected bool"),
        ("algorithm.max_resample_rounds=2", "needs algorithm.dynamic_sampling: true"),
    ],
)
def test_invalid_values_are_named(override, message):
    with pytest.raises(ConfigError, match="invalid configuration") as err:
        load_config("default", [override])
    assert message in str(err.value)
