"""Bad data, bad config and unsafe models through the ``tepo`` command line.

Each bad input gives exit status 2 and one ``tepo: error:`` message naming the file, line and field (data) or the
key (config), and it does so before any model is loaded: ``tepo.models.load_model_and_tokenizer`` is replaced
by a function that fails the test if it is ever called. No model is loaded anywhere in this file.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import yaml

import tepo.models
from tepo.cli import main


class ModelLoaded(AssertionError):
    pass


@pytest.fixture
def loader_calls(monkeypatch):
    """Every call of the model loader, recorded; the call then fails (no test here may reach a model)."""
    calls = []

    def forbidden(*args, **kwargs):
        calls.append((args, kwargs))
        raise ModelLoaded(f"the model loader was called: {args} {kwargs}")

    monkeypatch.setattr(tepo.models, "load_model_and_tokenizer", forbidden)
    return calls


def run_cli(argv, capsys) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


def train_argv(tmp_path, *extra) -> list[str]:
    """``tepo train`` with options first: argparse does not take ``--data F`` after ``key=value`` overrides."""
    options, overrides, items = [], [], list(extra)
    while items:
        item = items.pop(0)
        if item == "--trust-remote-code":
            options.append(item)
        elif item.startswith("--"):
            options += [item, items.pop(0)]
        else:
            overrides.append(item)
    return [
        "train",
        "--output-dir",
        str(tmp_path / "runs"),
        *options,
        "log.progress=false",
        "train.run_name=r",
        *overrides,
    ]


def assert_one_error(err: str, *needles: str) -> None:
    assert err.count("tepo: error:") == 1, err
    assert err.startswith("tepo: error:"), err
    for needle in needles:
        assert needle in err, f"{needle!r} not in {err!r}"


# ------------------------------------------------------------------------------------------------------------
# Bad data files: file, line, field
# ------------------------------------------------------------------------------------------------------------

GOOD = b'{"problem": "What is 1+1?", "answer": "2"}\n'

DATA_CASES = {
    # name: (file bytes, expected pieces of the message after "<path>")
    "missing_answer": (GOOD + b'{"problem": "What is 2+2?"}\n', [":2: missing field 'answer'"]),
    "missing_problem": (
        b'{"question": "x", "answer": "2"}\n',
        [":1: missing field 'problem'", "data.problem_field"],
    ),
    "empty_answer": (
        GOOD + GOOD + b'{"problem": "3+3?", "answer": "   "}\n',
        [":3: field 'answer' is empty"],
    ),
    "empty_problem": (b'{"problem": "", "answer": "1"}\n', [":1: field 'problem' is empty"]),
    "answer_is_null": (
        b'{"problem": "1+1?", "answer": null}\n',
        [":1: field 'answer' must be a string or number"],
    ),
    "answer_is_list": (
        b'{"problem": "1+1?", "answer": [2]}\n',
        [":1: field 'answer' must be a string or number"],
    ),
    "answer_is_bool": (
        b'{"problem": "1+1?", "answer": true}\n',
        [":1: field 'answer' must be a string or number"],
    ),
    "answer_is_nan": (
        b'{"problem": "1+1?", "answer": NaN}\n',
        [":1: field 'answer' must be a finite number"],
    ),
    "problem_is_object": (
        b'{"problem": {"t": 1}, "answer": "1"}\n',
        [":1: field 'problem' must be a string"],
    ),
    "row_not_an_object": (GOOD + b'["1+1?", "2"]\n', [":2: expected a JSON object with fields 'problem'"]),
    "invalid_json": (GOOD + b'{"problem": "1+1?", answer: 2}\n', [":2: invalid JSON"]),
    "truncated_json": (GOOD + b'{"problem": "1+1?", "ans', [":2: invalid JSON"]),
    "latin1_bytes": (
        GOOD + '{"problem": "café?", "answer": "1"}\n'.encode("latin-1"),
        [":2: not valid UTF-8"],
    ),
    "binary_junk": (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", [":1: not valid UTF-8"]),
    "empty_file": (b"", [": no problems found (the file or split is empty)"]),
    "only_blank_lines": (b"\n  \n\t\n", [": no problems found"]),
}


@pytest.mark.parametrize("name", sorted(DATA_CASES))
def test_bad_data_file_is_one_message_before_any_model(tmp_path, capsys, loader_calls, name):
    content, pieces = DATA_CASES[name]
    path = tmp_path / f"{name}.jsonl"
    path.write_bytes(content)
    code, err = run_cli(train_argv(tmp_path, "--data", str(path)), capsys)
    assert code == 2
    assert_one_error(err, *[f"{path}{piece}" if piece.startswith(":") else piece for piece in pieces])
    assert err.count("\n") == 1, "one message, one line"
    assert not loader_calls
    assert not (tmp_path / "runs").exists(), "bad data must not leave a run directory behind"


def test_missing_and_directory_data_paths(tmp_path, capsys, loader_calls):
    code, err = run_cli(train_argv(tmp_path, "--data", str(tmp_path / "nope.jsonl")), capsys)
    assert code == 2
    assert_one_error(err, f"{tmp_path / 'nope.jsonl'}: no such file")
    code, err = run_cli(train_argv(tmp_path, "--data", str(tmp_path)), capsys)
    assert code == 2
    assert_one_error(err, f"{tmp_path}: is a directory; expected a .jsonl or .parquet file")
    assert not loader_calls


def test_bad_held_out_file_is_caught_before_the_model_too(tmp_path, capsys, loader_calls):
    good, bad = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    good.write_bytes(GOOD * 3)
    bad.write_bytes(GOOD + b'{"problem": "x", "answer": ""}\n')
    code, err = run_cli(
        train_argv(tmp_path, "--data", str(good), f"eval.source={bad}", "eval.size=2"), capsys
    )
    assert code == 2
    assert_one_error(err, f"{bad}:2: field 'answer' is empty")
    assert not loader_calls


def test_too_few_problems_to_hold_out_is_a_config_error(tmp_path, capsys, loader_calls):
    path = tmp_path / "small.jsonl"
    path.write_bytes(GOOD * 3)
    code, err = run_cli(train_argv(tmp_path, "--data", str(path), "eval.size=3"), capsys)
    assert code == 2
    assert_one_error(err, "has 3 problems, too few to hold out eval.size=3")
    assert not loader_calls


def test_custom_field_names_reach_the_loader(tmp_path, capsys, loader_calls):
    path = tmp_path / "custom.jsonl"
    path.write_bytes(b'{"q": "1+1?", "a": "2"}\n{"q": "2+2?"}\n')
    code, err = run_cli(
        train_argv(
            tmp_path, "--data", str(path), "data.problem_field=q", "data.answer_field=a", "eval.size=0"
        ),
        capsys,
    )
    assert code == 2
    assert_one_error(err, f"{path}:2: missing field 'a' (row has ['q'])")
    assert not loader_calls


# ------------------------------------------------------------------------------------------------------------
# Bad configuration: the key
# ------------------------------------------------------------------------------------------------------------

CONFIG_CASES = {
    "unknown_key": (["train.stepz=3"], "unknown key 'train.stepz'"),
    "unknown_section": (["trainer.steps=3"], "unknown key 'trainer'"),
    "int_as_text": (["train.steps=three"], "train.steps: expected int, got 'three'"),
    "int_as_float": (["train.prompts_per_step=2.5"], "train.prompts_per_step: expected int, got 2.5"),
    "float_as_text": (["optim.lr=fast"], "optim.lr: expected a finite float, got 'fast'"),
    "float_is_nan": (["reward.timeout_s=.nan"], "reward.timeout_s: expected a finite float"),
    "bool_as_text": (["log.progress=maybe"], "log.progress: expected bool, got 'maybe'"),
    "section_as_value": (["rollout=8"], "rollout: expected a mapping, got 8"),
    "tuple_wrong_length": (["optim.betas=[0.9]"], "optim.betas: expected tuple"),
    "mini_batch_larger_than_batch": (
        ["train.prompts_per_step=4", "train.mini_batch_prompts=8"],
        "train.mini_batch_prompts (8) is larger than the batch, train.prompts_per_step (4)",
    ),
    "group_of_one_grpo": (["rollout.group_size=1"], "rollout.group_size is 1 but algorithm.advantage='grpo'"),
    **{
        f"group_of_one_{label}": (
            ["rollout.group_size=1", f"algorithm.advantage={name}"],
            f"rollout.group_size is 1 but algorithm.advantage='{name}'",
        )
        for label, name in (("rloo", "rloo"), ("token_level", "entropy_adv"))
    },
    "unknown_loss": (["algorithm.loss=ppo2"], "algorithm.loss: unknown loss 'ppo2' (valid: "),
    "unknown_estimator": (["algorithm.advantage=gae"], "algorithm.advantage: unknown estimator 'gae'"),
    "unknown_loss_option": (
        ["algorithm.loss_options={epsilon: 0.2}"],
        "unknown option(s) epsilon for policy loss",
    ),
    "unknown_estimator_option": (["algorithm.advantage_options={norm: 1}"], "unknown option(s) ['norm']"),
    "zero_group": (["rollout.group_size=0"], "rollout.group_size: must be >= 1, got 0"),
    "zero_max_bad_steps": (["train.max_bad_steps=0"], "train.max_bad_steps: must be >= 1, got 0"),
    "negative_limit": (["data.limit=-5"], "data.limit: must be >= 1"),
    "resample_without_dynamic": (
        ["algorithm.max_resample_rounds=2"],
        "needs algorithm.dynamic_sampling: true",
    ),
    "not_key_value": (["train.steps"], "override 'train.steps': expected key=value"),
}


@pytest.mark.parametrize("name", sorted(CONFIG_CASES))
def test_bad_config_names_the_key_before_any_model(tmp_path, capsys, loader_calls, name):
    overrides, expected = CONFIG_CASES[name]
    code, err = run_cli(train_argv(tmp_path, *overrides), capsys)
    assert code == 2
    assert_one_error(err, expected)
    assert not loader_calls
    assert not (tmp_path / "runs").exists(), "an invalid config must not create a run directory"


def test_bad_yaml_files(tmp_path, capsys, loader_calls):
    cases = {
        "syntax.yaml": (b"train: {steps: 3\n", "invalid YAML"),
        "list.yaml": (b"- 1\n- 2\n", "expected a mapping of sections at top level"),
        "latin1.yaml": ("train: {run_name: café}\n".encode("latin-1"), "not valid UTF-8"),
        "unknown.yaml": (b"train: {stepz: 3}\n", "unknown key 'train.stepz' in "),
        "base.yaml": (b"base: no_such_preset\n", "base.yaml: base 'no_such_preset' (looked in"),
    }
    for name, (content, expected) in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        code, err = run_cli(["train", "--config", str(path), "log.progress=false"], capsys)
        assert code == 2, name
        assert_one_error(err, expected)
        if name in ("syntax.yaml", "latin1.yaml", "unknown.yaml", "list.yaml"):
            assert str(path) in err, f"{name}: the message does not name the file: {err}"
    code, err = run_cli(["train", "--config", "no_such_preset"], capsys)
    assert code == 2
    assert_one_error(err, "no such file or preset (presets: ")
    assert not loader_calls


def test_resume_of_a_non_run_directory_is_one_message(tmp_path, capsys, loader_calls):
    code, err = run_cli(["train", "--resume", str(tmp_path)], capsys)
    assert code == 2
    assert_one_error(err, f"{tmp_path}: not a run directory (no config.yaml)")
    assert not loader_calls


def test_resume_with_a_bad_override_or_data_stops_before_the_model(tmp_path, capsys, loader_calls):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"train": {"steps": 2}, "log": {"progress": False}}))
    code, err = run_cli(["train", "--resume", str(run), "train.stepz=3"], capsys)
    assert code == 2
    assert_one_error(err, "unknown key 'train.stepz'")
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"problem": "x"}\n')
    code, err = run_cli(["train", "--resume", str(run), f"data.source={bad}"], capsys)
    assert code == 2
    assert_one_error(err, f"{bad}:1: missing field 'answer'")
    assert not loader_calls


def test_a_run_directory_that_holds_a_run_is_not_overwritten(tmp_path, capsys, loader_calls):
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    code, err = run_cli(train_argv(tmp_path), capsys)
    assert code == 2
    assert_one_error(err, "already holds a run; resume it with --resume")
    assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert not loader_calls


# ------------------------------------------------------------------------------------------------------------
# Valid input reaches the loader, with the settings the user gave
# ------------------------------------------------------------------------------------------------------------


def test_trust_remote_code_flag_reaches_the_config_and_the_loader(tmp_path, capsys, loader_calls):
    with pytest.raises(ModelLoaded):
        main(train_argv(tmp_path, "--trust-remote-code", "eval.size=0"))
    assert loader_calls[-1][1]["trust_remote_code"] is True
    saved = yaml.safe_load((tmp_path / "runs" / "r" / "config.yaml").read_text())
    assert saved["model"]["trust_remote_code"] is True
    with pytest.raises(ModelLoaded):
        main(train_argv(tmp_path, "train.run_name=r2", "eval.size=0"))
    assert loader_calls[-1][1]["trust_remote_code"] is False  # off unless asked for


def test_trust_remote_code_flag_also_applies_on_resume(tmp_path, capsys, loader_calls):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"eval": {"size": 0}, "log": {"progress": False}}))
    with pytest.raises(ModelLoaded):
        main(["train", "--resume", str(run), "--trust-remote-code"])
    assert loader_calls[-1][1]["trust_remote_code"] is True


def test_a_failed_start_does_not_leave_its_config_to_the_next_run(tmp_path, capsys, loader_calls):
    bad, good = tmp_path / "bad.jsonl", tmp_path / "good.jsonl"
    bad.write_bytes(b'{"problem": "x"}\n')
    good.write_bytes(GOOD * 3)
    assert run_cli(train_argv(tmp_path, "--data", str(bad), "eval.size=0"), capsys)[0] == 2
    with pytest.raises(ModelLoaded):  # the corrected command gets as far as the model
        main(train_argv(tmp_path, "--data", str(good), "eval.size=0"))
    saved = yaml.safe_load((tmp_path / "runs" / "r" / "config.yaml").read_text())
    assert saved["data"]["source"] == str(good), "a later --resume would train on the file that failed"


# ------------------------------------------------------------------------------------------------------------
# Unsafe model directories: refused before any weight or code is read (the real loader, no model needed)
# ------------------------------------------------------------------------------------------------------------

LLAMA_CONFIG = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 16,
    "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
}  # fmt: skip


class _TouchOnUnpickle:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _pickle_weights(directory: Path, marker: Path) -> None:
    with open(directory / "pytorch_model.bin", "wb") as handle:
        pickle.dump({"model.embed_tokens.weight": _TouchOnUnpickle(marker)}, handle)


def test_pickle_weights_are_refused_and_never_unpickled(tmp_path):
    model_dir, marker = tmp_path / "pickled", tmp_path / "pwned"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    _pickle_weights(model_dir, marker)
    with pytest.raises(ValueError, match=r"has no \*\.safetensors weights; tepo loads weights only from"):
        tepo.models.load_model_and_tokenizer(model_dir)
    assert not marker.exists()


def test_remote_code_is_refused_before_anything_is_read(tmp_path):
    model_dir, marker = tmp_path / "custom", tmp_path / "pwned"
    model_dir.mkdir()
    auto_map = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
    (model_dir / "config.json").write_text(json.dumps({**LLAMA_CONFIG, "auto_map": auto_map}))
    (model_dir / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    _pickle_weights(model_dir, marker)
    with pytest.raises(ValueError, match=r"requests custom code \(config.json has auto_map"):
        tepo.models.load_model_and_tokenizer(model_dir)
    assert not marker.exists()


def test_remote_code_refusal_is_a_clean_cli_error(tmp_path, capsys):
    model_dir = tmp_path / "custom"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({**LLAMA_CONFIG, "auto_map": {"AutoModel": "m.M"}}))
    code, err = run_cli(train_argv(tmp_path, "--model", str(model_dir), "eval.size=0"), capsys)
    assert code == 2
    assert_one_error(err, "requests custom code", "--trust-remote-code")


def test_a_model_path_that_does_not_exist_is_a_clean_cli_error(tmp_path, capsys):
    missing = tmp_path / "no" / "such-model"
    code, err = run_cli(train_argv(tmp_path, "--model", str(missing), "eval.size=0"), capsys)
    assert code == 2
    assert_one_error(err, f"model path {str(missing)!r} does not exist")
