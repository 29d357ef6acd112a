"""Paths in a YAML file are read from that file's folder (``base:``, ``data.source``, ``eval.source``, the
``path`` of ``reward.functions``), with the working directory as the fallback, and a ``base:`` that is found
nowhere is an error that names the file that asked for it."""

from __future__ import annotations

import pytest

from tepo.config import ConfigError, load_config


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A config in project/configs/ naming its base, data and reward by paths relative to its folder, and a
    working directory elsewhere."""
    folder = tmp_path / "project" / "configs"
    (folder / "parts").mkdir(parents=True)
    (folder / "parts" / "base.yaml").write_text(
        "base: default\ntrain: {steps: 7}\ndata: {source: rows.jsonl}\n"
    )
    (folder / "parts" / "rows.jsonl").write_text('{"problem": "p", "answer": "1"}\n')
    (folder / "reward.py").write_text("def compute_score(solution_str):\n    return 1.0\n")
    (folder / "run.yaml").write_text(
        "base: parts/base.yaml\nreward:\n  functions: [{path: reward.py, name: compute_score}]\n"
        "eval: {source: gsm8k, size: 0}\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return folder


def test_paths_are_read_from_the_folder_of_the_file_that_names_them(project):
    config = load_config(str(project / "run.yaml"))
    assert config.train.steps == 7  # the base, found beside run.yaml
    assert config.data.source == str(project / "parts" / "rows.jsonl")  # from base.yaml's own folder
    assert config.reward.functions == [{"path": str(project / "reward.py"), "name": "compute_score"}]
    assert config.eval.source == "gsm8k"  # a name, not a path: left alone


def test_a_path_not_beside_the_file_is_read_from_the_working_directory(project, tmp_path):
    (tmp_path / "elsewhere" / "mine.jsonl").write_text('{"problem": "p", "answer": "1"}\n')
    (project / "cwd.yaml").write_text("data: {source: mine.jsonl}\n")
    assert load_config(str(project / "cwd.yaml")).data.source == "mine.jsonl"
    # a Hugging Face dataset name stays a name
    (project / "hub.yaml").write_text("data: {source: openai/gsm8k}\n")
    assert load_config(str(project / "hub.yaml")).data.source == "openai/gsm8k"


def test_a_missing_base_names_the_file_that_asked_for_it(project):
    (project / "bad.yaml").write_text("base: parts/nothere.yaml\n")
    with pytest.raises(ConfigError) as caught:
        load_config(str(project / "bad.yaml"))
    message = str(caught.value)
    assert message.startswith(f"{project / 'bad.yaml'}: base 'parts/nothere.yaml'")
    assert f"looked in {project}" in message and "no such file or preset" in message
