"""The metrics log's optional sinks, read back from the files they write: TensorBoard event files (through
TensorBoard's own EventAccumulator) and a W&B offline run (its ``run-<id>.wandb`` record log, parsed with W&B's
own protobuf schema). Each sink gets every numeric value of a row at the row's step, and nothing else: booleans,
strings and non-finite values (which the JSONL log writes as strings) stay out; the metric names are the grouped
ones the JSONL log writes (tepo.metrics.names: ``loss`` -> ``update/loss``)."""

from __future__ import annotations

import json
import struct
import sys

import pytest

from tepo.config import load_config
from tepo.metrics import MetricsLog, read_metrics

ROWS = [
    {
        "step": 1,
        "update/loss": 0.5,
        "reward": 1.0,
        "clipped": True,
        "note": "x",
        "update/grad_norm": float("nan"),
    },
    {"step": 2, "update/loss": 0.25, "reward": 0.0, "update/lr": 2e-5},
]
# What a sink must receive: the numeric, finite, non-boolean values of each row, at the row's step, by the names
# the row has (the phases name their metrics in their groups).
EXPECTED = {
    1: {"step": 1, "update/loss": 0.5, "reward": 1.0},
    2: {"step": 2, "update/loss": 0.25, "reward": 0.0, "update/lr": 2e-5},
}


def _log_rows(run_dir, **sinks) -> None:
    log = MetricsLog(run_dir, **sinks)
    for row in ROWS:
        log.append(row)
    log.close()
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")] == [1, 2]  # the record of truth too


# ----- TensorBoard ---------------------------------------------------------------------------------------------


def test_tensorboard_events_hold_every_numeric_value_at_its_step(tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _log_rows(tmp_path / "run", tensorboard=True)
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    got: dict[int, dict[str, float]] = {}
    for tag in events.Tags()["scalars"]:
        for event in events.Scalars(tag):
            got.setdefault(event.step, {})[tag] = event.value
    assert got.keys() == EXPECTED.keys()
    for step, values in EXPECTED.items():
        assert got[step] == pytest.approx(values, rel=1e-6)  # event values are float32


def test_tensorboard_missing_says_which_extra_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(RuntimeError, match=r"log\.tensorboard needs .*tepo\[tensorboard\]"):
        MetricsLog(tmp_path, tensorboard=True)


# ----- Weights & Biases (offline) ------------------------------------------------------------------------------

_BLOCK, _HEADER = 32768, 7  # LevelDB log framing of W&B's record file: 32 KiB blocks, 7-byte record headers


def _wandb_records(path):
    """The protobuf records of a W&B ``.wandb`` file (LevelDB log format after a 7-byte ``:W&B`` file header:
    each chunk is crc32c (4 bytes), length (2, little-endian), type (1: full, 2: first, 3: middle, 4: last))."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B record file"
    pos, pending = _HEADER, b""
    while pos + _HEADER <= len(data):
        if _BLOCK - pos % _BLOCK < _HEADER:  # a block's tail too short for a header is zero padding
            pos += _BLOCK - pos % _BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        pending += data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def _key(item) -> str:
    """An item's key: W&B writes it either as ``key`` or as the parts of ``nested_key``."""
    return item.key or "/".join(item.nested_key)


def test_wandb_offline_run_holds_every_numeric_value_at_its_step_and_the_config(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="the wandb extra is not installed")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "my-run"
    run_config = load_config("default", ["log.wandb=true"]).to_dict()  # what the trainer passes
    _log_rows(run_dir, wandb=True, wandb_project="tepo-test", config=run_config)
    # run.finish() can return before W&B's service process has written the records (measured: the file was
    # still its 7-byte header right after close(), complete a second later); teardown waits for that process,
    # as interpreter exit does.
    import wandb

    wandb.teardown()

    files = list((run_dir / "wandb").glob("offline-run-*/run-my-run.wandb"))
    assert len(files) == 1, f"expected one offline run named after the run directory, got {files}"
    history: dict[int, dict] = {}
    runs = []
    for record in _wandb_records(files[0]):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {_key(item): json.loads(item.value_json) for item in record.history.item}
            history[record.history.step.num] = {k: v for k, v in items.items() if not k.startswith("_")}
        elif kind == "run":
            runs.append(record.run)
    assert history.keys() == EXPECTED.keys()
    for step, values in EXPECTED.items():
        assert history[step] == pytest.approx(values)
    assert runs and runs[0].run_id == "my-run" and runs[0].project == "tepo-test"
    config = {_key(item): json.loads(item.value_json) for item in runs[0].config.update}
    assert config.keys() - {"_wandb"} == run_config.keys()
    assert config["algorithm"] == json.loads(json.dumps(run_config["algorithm"]))


def test_wandb_missing_says_which_extra_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(RuntimeError, match=r"log\.wandb needs .*tepo\[wandb\]"):
        MetricsLog(tmp_path, wandb=True)
