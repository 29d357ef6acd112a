"""Which checkpoints a run writes and keeps: ``should_save`` (train.save_every / train.save_final), pruning to the
``keep_last`` newest intact checkpoints (the one just written always kept, broken ones never counted), and the
config keys, with ``train.keep_checkpoints`` read as a deprecated alias of ``train.keep_last``."""

from __future__ import annotations

import pytest
import torch

from tepo.checkpoint import (
    find_latest_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    save_checkpoint,
    should_save,
    verify_checkpoint,
)
from tepo.config import ConfigError, config_warnings, load_config


def _names(run_dir) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


def _save(run_dir, step: int, keep: int):
    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.fill_(step)
    return save_checkpoint(run_dir, step, model, {"marker": step}, keep=keep)


def _flip_bytes(path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, new content: only the checksum can tell
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_keep_last_leaves_exactly_the_newest_keep_checkpoints_intact(tmp_path, keep):
    for step in range(1, 7):
        _save(tmp_path, step, keep)
        expected = [f"step_{s:06d}" for s in range(max(1, step - keep + 1), step + 1)]
        assert _names(tmp_path) == expected
    for name in _names(tmp_path):
        assert verify_checkpoint(tmp_path / "checkpoints" / name) is None


def test_a_corrupt_checkpoint_is_not_counted_and_the_previous_intact_one_is_kept(tmp_path):
    for step in (1, 2, 3):
        _save(tmp_path, step, keep=2)
    assert _names(tmp_path) == ["step_000002", "step_000003"]
    _flip_bytes(tmp_path / "checkpoints" / "step_000003" / "state.pt")
    _save(tmp_path, 4, keep=2)
    # step 3 is useless (a resume skips it), so it is deleted and step 2 stays as the second intact one.
    assert _names(tmp_path) == ["step_000002", "step_000004"]
    (tmp_path / "checkpoints" / "step_000004" / "manifest.json").unlink()  # step 4 torn after the fact
    _save(tmp_path, 5, keep=2)
    assert _names(tmp_path) == ["step_000002", "step_000005"]


def test_the_checkpoint_just_written_is_never_deleted(tmp_path):
    """Even when a directory with a higher step exists (left broken by an earlier process whose resume skipped
    it): the new checkpoint stays, the broken one goes, and a resume finds the new one."""
    for step in (1, 2):
        _save(tmp_path, step, keep=0)
    stale = tmp_path / "checkpoints" / "step_000009"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")  # no manifest: an interrupted copy
    written = _save(tmp_path, 3, keep=1)
    assert _names(tmp_path) == ["step_000003"]
    assert find_latest_checkpoint(tmp_path).path == written


def test_keep_zero_keeps_every_checkpoint_and_only_torn_temporaries_go(tmp_path):
    for step in (1, 2, 3):
        _save(tmp_path, step, keep=0)
    torn = tmp_path / "checkpoints" / "step_000004.tmp-4242"
    torn.mkdir()
    removed = prune_checkpoints(tmp_path, 0)
    assert removed == ["step_000004.tmp-4242"]
    assert _names(tmp_path) == ["step_000001", "step_000002", "step_000003"]


def test_directories_that_are_not_checkpoints_are_left_alone(tmp_path):
    (tmp_path / "checkpoints" / "step_backup").mkdir(parents=True)
    for step in (1, 2, 3):
        _save(tmp_path, step, keep=1)
    assert _names(tmp_path) == ["step_000003", "step_backup"]


def test_pruning_after_a_restart_checks_checkpoints_it_did_not_write(tmp_path):
    """A new process (empty in-memory record) verifies the older checkpoints before counting them."""
    import tepo.checkpoint as checkpoint

    for step in (1, 2):
        _save(tmp_path, step, keep=0)
    _flip_bytes(tmp_path / "checkpoints" / "step_000002" / "model.safetensors")
    checkpoint._KNOWN_INTACT.clear()
    _save(tmp_path, 3, keep=2)
    assert _names(tmp_path) == ["step_000001", "step_000003"]
    loaded = load_checkpoint(find_latest_checkpoint(tmp_path), torch.nn.Linear(3, 2))
    assert loaded["marker"] == 3


def test_a_negative_keep_is_refused():
    with pytest.raises(ValueError, match="keep must be >= 0"):
        save_checkpoint("unused", 1, torch.nn.Linear(1, 1), {}, keep=-1)


@pytest.mark.parametrize(
    ("save_every", "save_final", "saved"),
    [
        (4, True, [4, 8, 10]),  # periodic and the last step
        (4, False, [4, 8]),
        (5, True, [5, 10]),  # the last step is a multiple: saved once
        (0, True, [10]),  # the last one only
        (0, False, []),  # checkpoints off
    ],
)
def test_should_save(save_every, save_final, saved):
    assert [step for step in range(1, 11) if should_save(step, 10, save_every, save_final)] == saved


# ---------------------------------------------------------------- config keys


def test_checkpoint_keys_defaults():
    train = load_config().train
    assert (train.save_every, train.save_final, train.keep_last) == (4, True, 2)
    assert (train.save_optimizer, train.resume_without_optimizer) == (True, False)
    assert "keep_checkpoints" not in load_config().to_dict()["train"]


def test_keep_checkpoints_is_read_as_keep_last_with_a_note(tmp_path):
    old_run_config = tmp_path / "config.yaml"  # as saved by a run from before the rename
    old_run_config.write_text("train: {steps: 3, keep_checkpoints: 5}\n")
    config = load_config(str(old_run_config))
    assert config.train.keep_last == 5 and config.train.keep_checkpoints == 5
    assert config_warnings(config) == [
        f"train.keep_checkpoints in {old_run_config} is deprecated: rename it train.keep_last "
        "(read as train.keep_last=5 there)"
    ]
    # An override of the new name beats the file's old one; the config saved from it has only the new name.
    config = load_config(str(old_run_config), ["train.keep_last=1"])
    assert config.train.keep_last == 1 and "keep_checkpoints" not in config.to_dict()["train"]
    # An override of the old name beats the file too (each layer is read on its own).
    assert load_config(str(old_run_config), ["train.keep_checkpoints=0"]).train.keep_last == 0


def test_both_names_in_one_place_with_different_values_is_an_error():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["train.keep_checkpoints=7", "train.keep_last=1"])
    assert "train.keep_checkpoints and train.keep_last in the overrides differ (7 and 1)" in str(err.value)


def test_no_note_without_the_old_name():
    assert config_warnings(load_config(None, ["train.keep_last=3"])) == []


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.keep_last=-1", "train.keep_last: must be >= 0 (0 keeps all), got -1"),
        ("train.keep_checkpoints=-1", "train.keep_last: must be >= 0 (0 keeps all), got -1"),
        ("train.save_every=-1", "train.save_every, eval.every, eval.size and eval.samples must be >= 0"),
        ("train.save_final=1", "train.save_final: expected bool, got 1"),
        ("train.save_optimizer=no_moments", "train.save_optimizer: expected bool, got 'no_moments'"),
        ("train.resume_without_optimizer=yes please", "train.resume_without_optimizer: expected bool"),
    ],
)
def test_bad_checkpoint_keys_are_named(override, message):
    with pytest.raises(ConfigError, match="invalid configuration") as caught:
        load_config(None, [override])
    assert message in str(caught.value)
