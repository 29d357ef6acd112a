"""The one atomic-write helper (tepo.files): whole files or the old ones, fsync of file and folder, used
everywhere a reader or a resumed run must find a file whole."""

from __future__ import annotations

import ast
import os
import stat
from pathlib import Path

import pytest
import torch

from tepo.files import atomic_write_text, atomic_write_with

SRC = Path(__file__).resolve().parents[1] / "src" / "tepo"

# os.replace outside tepo.files, each with the reason it is not the durable helper.
OTHER_RENAMES = {
    "checkpoint.py": "a checkpoint is a folder: written whole under a temporary name (every file fsynced, a manifest "
    "of hashes), renamed, then its parent folder fsynced with tepo.files.fsync_folder",
    "models.py": "the converted model's cache folder: built under a temporary name and renamed under a lock",
    "compare/runner.py": "moves an interrupted run's partial metrics log aside (a rename, no content written)",
}


def test_write_replaces_whole_and_syncs_file_and_folder(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def spy(fd):
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    path = tmp_path / "summary.json"
    atomic_write_text(path, "old")
    atomic_write_text(path, "new ✓")
    assert path.read_text(encoding="utf-8") == "new ✓"
    assert synced == [False, True, False, True]  # the file, then its folder, each time
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temporary file left


def test_without_durability_the_rename_stays_and_the_fsyncs_go(tmp_path, monkeypatch):
    """durable=False (the per-step weight-sync file): still all or nothing, no fsync of file or folder."""
    synced = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd))
    path = tmp_path / "model.safetensors"
    atomic_write_with(path, lambda tmp: tmp.write_bytes(b"old"), durable=False)
    atomic_write_with(path, lambda tmp: tmp.write_bytes(b"new"), durable=False)
    assert path.read_bytes() == b"new"
    assert synced == []
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]


def test_the_weight_sync_and_token_records_write_through_the_helper(tmp_path, monkeypatch):
    """Both replaced their own temporary-file-and-rename with tepo.files (#45): the weight file without fsync."""
    import tepo.metrics.tokens as tokens
    import tepo.rollout.weight_sync as weight_sync

    calls = []
    real = atomic_write_with

    def spy(path, write, *, durable=True):
        calls.append((Path(path).name, durable))
        real(path, write, durable=durable)

    monkeypatch.setattr(weight_sync, "atomic_write_with", spy)
    monkeypatch.setattr(tokens, "atomic_write_text", lambda path, text: calls.append((Path(path).name, True)))
    model = torch.nn.Linear(2, 2)
    model.get_output_embeddings = lambda: None
    model.config = type("Config", (), {"to_dict": lambda self: {}})()
    weight_sync.write_weights(model, tmp_path / "weights", torch.float32)
    tokens.record_rollout_tokens(
        tmp_path, 3, [["a", "b"]], torch.ones(1, 2), torch.ones(1), torch.ones(1, 2), torch.ones(1)
    )
    assert calls == [("model.safetensors", False), ("step_000003.json", True)]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "config.yaml"
    atomic_write_text(path, "kept: true\n")

    def half_then_crash(tmp: Path) -> None:
        tmp.write_text("kept: fa")
        raise KeyboardInterrupt  # a kill mid-write

    with pytest.raises(KeyboardInterrupt):
        atomic_write_with(path, half_then_crash)
    assert path.read_text() == "kept: true\n"
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]


def test_the_package_renames_files_only_through_the_helper():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel == "files.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("replace", "rename"):
                owner = node.func.value
                if isinstance(owner, ast.Name) and owner.id == "os" and rel not in OTHER_RENAMES:
                    found.append(f"{rel}:{node.lineno}")
    assert found == [], f"write these through tepo.files.atomic_write_*: {found}"


def test_compare_table_is_written_atomically(tmp_path, monkeypatch):
    """write_table goes through the helper (a killed `tepo compare` keeps the old table)."""
    import tepo.compare.render as table_module  # write_table's home since compare/table.py was split

    written = []
    monkeypatch.setattr(table_module, "atomic_write_text", lambda path, text: written.append(Path(path).name))
    table = {
        "columns": [],
        "rows": [],
        "initial": None,
        "missing_runs": [],
        "precision": {"mixed": False, "unpaired": []},
        "threshold": {"metric": "reward_mean", "value": 0.5, "window": 3},
        "convergence": {},
        "statistics": {
            "interval": "student-t",
            "confidence": 0.95,
            "alpha": 0.05,
            "unit": "seed",
            "collapse": "-",
        },
    }
    table_module.write_table(table, tmp_path)
    assert written == ["table.md", "table.json"]
