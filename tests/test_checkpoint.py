"""tepo.checkpoint unit tests: round trip of weights (tied lm_head included), optimizer and RNG state; pruning;
state loaded with ``weights_only=True`` (a pickle in ``state.pt`` is refused, not run)."""

from __future__ import annotations

import json
import os
import pickle
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from helpers import tiny_llama, write_tiny_model
from tepo.checkpoint import (
    MANIFEST,
    CheckpointError,
    _sha256,
    find_latest_checkpoint,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
    verify_checkpoint,
)
from tepo.metrics import read_metrics


def _draws() -> tuple:
    return torch.rand(3).tolist(), random.random(), random.gauss(0, 1), np.random.rand(2).tolist()


def test_round_trip_restores_weights_tied_head_optimizer_and_rng(tmp_path):
    model = tiny_llama(0, tie=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()
    torch.manual_seed(123)
    random.seed(5)
    np.random.seed(7)
    random.gauss(0, 1)  # leaves a cached second Gaussian in Python's state: it must survive too
    state = {"optimizer": optimizer.state_dict(), "rng": rng_state(), "stream": {"epoch": 1, "offset": 3}}
    path = save_checkpoint(tmp_path, 7, model, state)
    expected_draws = _draws()

    saved = load_file(str(path / "model.safetensors"))
    assert "lm_head.weight" not in saved, "the tied head is stored once, as embed_tokens"
    assert verify_checkpoint(path) is None

    other = tiny_llama(1, tie=True)  # different weights everywhere
    other_optimizer = torch.optim.AdamW(other.parameters(), lr=1e-2)
    checkpoint = find_latest_checkpoint(tmp_path)
    assert checkpoint.step == 7 and checkpoint.path == path
    loaded = load_checkpoint(checkpoint, other)
    for name, tensor in model.state_dict().items():
        assert torch.equal(other.state_dict()[name], tensor), name
    # Still tied after loading: one tensor, so an update to the embedding is an update to the head.
    assert other.lm_head.weight.data_ptr() == other.model.embed_tokens.weight.data_ptr()

    other_optimizer.load_state_dict(loaded["optimizer"])
    for (_, a), (_, b) in zip(optimizer.state.items(), other_optimizer.state.items()):
        assert torch.equal(a["exp_avg"], b["exp_avg"]) and torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])
    assert loaded["step"] == 7 and loaded["stream"] == {"epoch": 1, "offset": 3}

    _draws()  # move every generator on
    set_rng_state(loaded["rng"])
    assert _draws() == expected_draws


def test_untied_model_round_trip_keeps_separate_head(tmp_path):
    model, other = tiny_llama(0), tiny_llama(1)
    path = save_checkpoint(tmp_path, 1, model, {"rng": rng_state()})
    assert "lm_head.weight" in load_file(str(path / "model.safetensors"))
    load_checkpoint(find_latest_checkpoint(tmp_path), other)
    assert torch.equal(other.lm_head.weight, model.lm_head.weight)
    assert other.lm_head.weight.data_ptr() != other.model.embed_tokens.weight.data_ptr()


def test_weights_that_do_not_fit_the_model_are_an_error(tmp_path):
    save_checkpoint(tmp_path, 1, torch.nn.Linear(2, 2), {})
    with pytest.raises(CheckpointError, match="weights do not fit the model"):
        load_checkpoint(find_latest_checkpoint(tmp_path), tiny_llama(0, tie=True))


def test_keep_prunes_old_checkpoints_and_torn_temporaries(tmp_path):
    model = torch.nn.Linear(3, 2)
    torn = tmp_path / "checkpoints" / "step_000002.tmp-99999"
    torn.mkdir(parents=True)
    (torn / "model.safetensors").write_bytes(b"half")
    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path, step, model, {}, keep=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step_000003", "step_000004"]
    for step in (5, 6):
        save_checkpoint(tmp_path, step, model, {}, keep=0)  # 0 keeps all
    assert len(list((tmp_path / "checkpoints").iterdir())) == 4


def test_saving_a_step_again_replaces_it(tmp_path):
    model = torch.nn.Linear(3, 2)
    save_checkpoint(tmp_path, 1, model, {"n": 1})
    with torch.no_grad():
        model.weight.add_(1)
    save_checkpoint(tmp_path, 1, model, {"n": 2})
    loaded = load_checkpoint(find_latest_checkpoint(tmp_path), torch.nn.Linear(3, 2))
    assert loaded["n"] == 2


class _TouchOnUnpickle:
    """A pickle payload: unpickling it creates a file (``Path.touch``), proof that code ran."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_state_is_loaded_with_weights_only_so_a_pickle_payload_never_runs(tmp_path):
    """A forged checkpoint (valid manifest, state.pt holding a code-running pickle) is refused, and nothing runs."""
    marker = tmp_path / "pwned"
    path = save_checkpoint(tmp_path, 1, torch.nn.Linear(2, 2), {})
    torch.save({"step": 1, "evil": _TouchOnUnpickle(marker)}, path / "state.pt")
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["files"]["state.pt"] = _sha256(path / "state.pt")
    (path / MANIFEST).write_text(json.dumps(manifest))
    assert verify_checkpoint(path) is None  # the forgery passes the checksum: only weights_only stops it
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        load_checkpoint(find_latest_checkpoint(tmp_path), torch.nn.Linear(2, 2))
    assert not marker.exists()
    # The same file with weights_only=False would run the payload: the test above is not vacuous.
    torch.load(path / "state.pt", weights_only=False)
    assert marker.exists()


# ---------------------------------------------------------------- a disk that fills up mid-save
# A real write failure, not a mock: the child process gets a file-size limit (RLIMIT_FSIZE) with SIGXFSZ ignored,
# so the kernel fails the write that crosses it with EFBIG, exactly where a full disk fails it with ENOSPC.

_LIMITED_WRITES = """
import resource, signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
"""


def _second_save_under_a_size_limit(run: Path, limit: int, second_state: str) -> str:
    """Save step 1 of a Linear(256, 256) (263 KB of weights) freely, then step 2 with ``second_state`` (Python
    source of its state dict) under a per-file size limit of ``limit`` bytes; what ``CheckpointError`` said."""
    script = (
        textwrap.dedent(
            """
        import sys, torch
        from pathlib import Path
        from tepo.checkpoint import CheckpointError, save_checkpoint
        run = Path(sys.argv[1])
        model = torch.nn.Linear(256, 256)
        save_checkpoint(run, 1, model, {"n": 1})
        """
        )
        + _LIMITED_WRITES.format(limit=limit)
        + textwrap.dedent(
            f"""
        try:
            save_checkpoint(run, 2, model, {second_state})
        except CheckpointError as err:
            print(err)
        else:
            print("saved")
        """
        )
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(run)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    message = done.stdout.strip()
    assert message.startswith("could not write checkpoint step_000002"), message
    assert "step_000001, is intact" in message
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000001"]  # no .tmp left behind
    return message


def test_a_failed_save_removes_its_partial_copy_and_keeps_the_previous_checkpoint(tmp_path):
    # The weights (263 KB) cross the 64 KB limit.
    message = _second_save_under_a_size_limit(tmp_path, 64 * 1024, '{"n": 2}')
    assert "File too large" in message
    assert f"tepo train --resume {tmp_path}" in message
    assert verify_checkpoint(tmp_path / "checkpoints" / "step_000001") is None
    assert load_checkpoint(find_latest_checkpoint(tmp_path), torch.nn.Linear(256, 256))["n"] == 1


def test_a_save_that_fails_in_the_optimizer_state_file_says_so_too(tmp_path):
    """The disk can fill during state.pt (torch.save, the optimizer's moments: twice the model in float32) rather
    than model.safetensors. torch reports that write failure as a RuntimeError ("unexpected pos ...",
    "iostream error"), not an OSError: it must still end as the one-message CheckpointError."""
    # The weights (263 KB) fit the 512 KB limit; the state's 800 KB tensor does not.
    message = _second_save_under_a_size_limit(tmp_path, 512 * 1024, '{"n": 2, "big": torch.zeros(200_000)}')
    assert "writing state.pt failed" in message


def test_tepo_train_on_a_full_disk_stops_with_one_message_and_resumes_once_there_is_room(
    tmp_path, embedded_model_dir
):
    """The CLI path: exit 1 with a one-line reason (no traceback), the step's metrics row kept, and a resume that
    finishes the run once writes succeed again."""
    write_tiny_model(tmp_path / "tiny", embedded_model_dir)  # a 3 MB checkpoint: past the 1 MB limit
    args = [
        f"model.name={tmp_path / 'tiny'}", f"train.output_dir={tmp_path}", "train.run_name=full",
        "rollout.backend=hf", "train.steps=2", "train.prompts_per_step=1", "rollout.group_size=2",
        "rollout.max_new_tokens=4", "eval.size=0", "train.save_every=1", "reward.num_workers=1",
        "log.progress=false",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    limited = (
        _LIMITED_WRITES.format(limit=1 << 20) + "import sys\nfrom tepo.cli import main\nsys.exit(main())"
    )
    done = subprocess.run(
        [sys.executable, "-c", limited, "train", *args], capture_output=True, text=True, timeout=300, env=env
    )
    run = tmp_path / "full"
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert "tepo: error: could not write checkpoint step_000001" in done.stderr
    assert "no earlier checkpoint exists" in done.stderr
    assert not list((run / "checkpoints").glob("*"))  # the half-written copy is gone
    assert [row["step"] for row in read_metrics(run / "metrics.jsonl")] == [1]

    resumed = subprocess.run(
        [sys.executable, "-m", "tepo.cli", "train", "--resume", str(run)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert [row["step"] for row in read_metrics(run / "metrics.jsonl")] == [1, 2]
    assert find_latest_checkpoint(run).step == 2
