"""``tepo config show``: every key of the schema printed with its meaning and default, and the printed YAML read
back by ``tepo train --config`` to the same configuration."""

from __future__ import annotations

import re

import pytest
import yaml

from tepo.cli import build_parser, main
from tepo.config import RunConfig, load_config
from tepo.config.meanings import MEANINGS
from tepo.config.reference import config_keys, show_config, yaml_value


def _show(capsys, *argv: str) -> str:
    assert main(["config", "show", *argv]) == 0
    return capsys.readouterr().out


def test_every_key_has_a_meaning_and_every_meaning_a_key():
    keys = config_keys()
    assert len(keys) == len(set(keys)) and "model.lora.rank" in keys and "rollout.vllm.dtype" in keys
    assert [k for k in keys if k not in MEANINGS] == [], "add a one-line meaning to tepo.config.meanings"
    assert [k for k in MEANINGS if k not in keys] == [], "a meaning names no key of the schema"
    for key, meaning in MEANINGS.items():
        assert meaning.strip() and "\n" not in meaning, key


@pytest.mark.parametrize(
    "argv",
    [
        ("default",),
        ("grpo",),
        ("clip_higher",),
        ("tepo_paper_qwen7b",),
        ("tepo_lora", "train.steps=3", "algorithm.loss_options={eps_low: 0.1, eps_high: 0.3}"),
    ],
)
def test_show_save_load_gives_the_same_config(capsys, tmp_path, argv):
    """The printed text, saved as it is, loads to the configuration it was printed from."""
    text = _show(capsys, *argv)
    saved = tmp_path / "saved.yaml"
    saved.write_text(text, encoding="utf-8")
    assert load_config(str(saved)).to_dict() == load_config(argv[0], list(argv[1:])).to_dict()


def test_every_key_is_printed_with_its_meaning_and_default(capsys):
    text = _show(capsys)  # no preset: the embedded default
    lines = text.splitlines()
    defaults = RunConfig().to_dict()
    for key in config_keys():
        leaf = key.rsplit(".", 1)[-1]
        depth = key.count(".")
        node = defaults
        for part in key.split("."):
            node = node[part]
        comment = f"{'  ' * depth}# {MEANINGS[key]} [default: {yaml_value(node)}]"
        index = lines.index(comment)  # ValueError names the key's missing comment
        while lines[index + 1].startswith(f"{'  ' * depth}#   "):  # more about the key, under its meaning
            index += 1
        assert re.fullmatch(rf"{'  ' * depth}{leaf}: .+", lines[index + 1]), (key, lines[index + 1])
    assert yaml.safe_load(text)["train"]["steps"] == 12


def test_an_edited_file_trains_with_the_edit(tmp_path):
    text = show_config(load_config("tepo"), title="tepo")
    edited = text.replace("\n  steps: 12\n", "\n  steps: 5\n").replace("\n  loss: tepo\n", "\n  loss: grpo\n")
    assert edited.count("steps: 5") == 1 and edited != text
    (tmp_path / "mine.yaml").write_text(edited, encoding="utf-8")
    config = load_config(str(tmp_path / "mine.yaml"), ["train.seed=3"])
    assert (config.train.steps, config.algorithm.loss, config.train.seed) == (5, "grpo", 3)


def test_values_read_back_as_written():
    for value in (
        None,
        True,
        0,
        2e-5,
        0.25,
        "auto",
        "a: b # c",
        "two\nlines",
        [0.9, 0.999],
        {"eps": 0.2},
        [{"name": "correctness", "weight": 1.0}],
        "\\boxed{}",
        "1e-4",
        "null",
        "",
    ):
        text = yaml_value(value)
        assert "\n" not in text and yaml.safe_load(f"key: {text}")["key"] == value, (value, text)


def test_a_bad_override_is_one_line_and_status_2(capsys):
    assert main(["config", "show", "grpo", "train.stepz=3"]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'train.stepz'" in err and err.startswith("tepo: error:")


def test_train_help_points_to_config_show():
    parser = build_parser()
    train = parser._subparsers._group_actions[0].choices["train"]
    assert "tepo config show" in train.format_help()


def test_config_show_takes_train_s_flags_so_a_train_command_previews_by_changing_its_verb(capsys):
    args = ["--config", "grpo", "--model", "my/model", "--data", "rows.jsonl", "train.steps=3"]
    assert main(["config", "show", *args]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["algorithm"]["loss"] == "grpo" and shown["model"]["name"] == "my/model"
    assert shown["data"]["source"] == "rows.jsonl" and shown["train"]["steps"] == 3
    assert main(["config", "show", "tepo", "--config", "grpo"]) == 2
    assert "give the configuration once" in capsys.readouterr().err


def test_reward_function_fields_and_the_loss_s_options_are_explained(capsys):
    assert main(["config", "show", "algorithm.loss=grpo"]) == 0
    out = capsys.readouterr().out
    assert "#   each entry: {name: correctness or format, weight: W} for a built-in" in out
    assert "label: its column and metrics' name" in out
    (options,) = [line for line in out.splitlines() if "grpo's options and defaults" in line]
    assert "eps_low: 0.2" in options and "agg: " in options
