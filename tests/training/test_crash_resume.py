"""Crash safety: runs killed with SIGKILL at random points, including inside a checkpoint write, resume
to exactly what an uninterrupted run produces.

- Default suite (fast, no model): a torn ``.tmp-`` directory, a corrupt file, a missing or unreadable manifest are
  each skipped, with a message, for the previous checkpoint; and a real process that checkpoints in a loop is
  SIGKILLed several times (some kills inside ``save_checkpoint``) and always resumes from an intact checkpoint
  with a metrics log that has every step exactly once.
- ``slow``: ``tepo train`` on the real embedded model, SIGKILLed at seeded random points and mid-checkpoint,
  resumed with ``tepo train --resume RUN_DIR`` until done, then compared with an uninterrupted run of the same
  seed: identical final parameters, identical ``metrics.jsonl`` rows (timing keys aside), no step missing or
  repeated, no process left behind.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tepo.checkpoint import MANIFEST, find_latest_checkpoint, load_checkpoint, save_checkpoint
from tepo.metrics import read_metrics

# ------------------------------------------------------------------------------------------------------------
# Helpers shared by the kill tests
# ------------------------------------------------------------------------------------------------------------


def _session_pids(sid: int) -> list[int]:
    """Live (non-zombie) processes of session ``sid``: the run and any reward workers it started."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            rest = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited while we looked
        if int(rest[3]) == sid and rest[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


def _kill_and_reap(proc: subprocess.Popen, grace_s: float = 15.0) -> list[int]:
    """SIGKILL the main process only (as the OOM killer or a preempted job would); wait for what it started to
    exit by itself. Returns the pids still alive after ``grace_s`` (then kills them, so nothing leaks)."""
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + grace_s
    while _session_pids(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _session_pids(proc.pid)
    if left:
        os.killpg(proc.pid, signal.SIGKILL)
    return left


def _wait_for_temporary(
    checkpoints: Path, proc: subprocess.Popen, timeout_s: float, poll_s: float = 0.005
) -> Path | None:
    """The ``step_*.tmp-<pid>`` directory this process is writing, as soon as it appears (None if it ends or
    ``timeout_s`` passes first)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        found = list(checkpoints.glob(f"step_*.tmp-{proc.pid}")) if checkpoints.exists() else []
        if found:
            return found[0]
        time.sleep(poll_s)
    return None


def _steps(rows: list[dict]) -> list[int]:
    return [row["step"] for row in rows]


# ------------------------------------------------------------------------------------------------------------
# Fast: detection of torn, corrupt and partial checkpoints
# ------------------------------------------------------------------------------------------------------------


def _three_checkpoints(tmp_path) -> list[Path]:
    model = torch.nn.Linear(4, 4)
    paths = []
    for step in (1, 2, 3):
        with torch.no_grad():
            model.weight.fill_(step)
        paths.append(save_checkpoint(tmp_path, step, model, {"marker": step}, keep=0))
    return paths


def _resume_step(tmp_path) -> tuple[int | None, list[str]]:
    messages = []
    found = find_latest_checkpoint(tmp_path, warn=messages.append)
    if found is None:
        return None, messages
    model = torch.nn.Linear(4, 4)
    state = load_checkpoint(found, model)
    assert state["marker"] == found.step and torch.all(model.weight == found.step)
    return found.step, messages


def test_torn_temporary_directory_is_skipped_with_a_message(tmp_path):
    _three_checkpoints(tmp_path)
    torn = tmp_path / "checkpoints" / "step_000004.tmp-4242"
    torn.mkdir()
    (torn / "model.safetensors").write_bytes(b"\x00" * 100)  # a write cut short
    step, messages = _resume_step(tmp_path)
    assert step == 3
    assert messages == ["skipping step_000004.tmp-4242: partial checkpoint left by an interrupted write"]


@pytest.mark.parametrize("name", ["model.safetensors", "state.pt"])
def test_corrupt_file_is_skipped_for_the_previous_checkpoint(tmp_path, name):
    paths = _three_checkpoints(tmp_path)
    target = paths[-1] / name
    data = bytearray(target.read_bytes())
    for i in (len(data) // 3, len(data) // 2, len(data) - 1):  # flip bytes in place: same size, new content
        data[i] ^= 0xFF
    target.write_bytes(bytes(data))
    step, messages = _resume_step(tmp_path)
    assert step == 2
    assert messages == [
        f"skipping checkpoint step_000003: {name} does not match its checksum (corrupt); trying the previous one"
    ]


def test_missing_manifest_and_missing_file_fall_back_two_checkpoints(tmp_path):
    paths = _three_checkpoints(tmp_path)
    (paths[2] / MANIFEST).unlink()  # killed before the manifest was written (a rename that should not happen)
    (paths[1] / "state.pt").unlink()  # a file lost afterwards
    step, messages = _resume_step(tmp_path)
    assert step == 1
    assert messages == [
        "skipping checkpoint step_000003: no manifest (the write was interrupted); trying the previous one",
        "skipping checkpoint step_000002: state.pt is missing; trying the previous one",
    ]


@pytest.mark.parametrize(
    "content",
    [
        b'{"step": 3, "files": {"model.saf',
        b'\xff\xfe{"files": {}}',
        b"[1, 2]",
        b'{"files": [1]}',
        b'{"files": {}}',
    ],
    ids=["truncated", "not-utf8", "list", "files-not-a-dict", "files-empty"],
)
def test_unreadable_or_incomplete_manifest_is_skipped(tmp_path, content):
    paths = _three_checkpoints(tmp_path)
    (paths[2] / MANIFEST).write_bytes(content)
    step, messages = _resume_step(tmp_path)
    assert step == 2
    assert len(messages) == 1 and messages[0].startswith("skipping checkpoint step_000003: ")
    assert "unreadable manifest" in messages[0] or "manifest does not list" in messages[0]


def test_nothing_intact_means_a_fresh_start(tmp_path):
    paths = _three_checkpoints(tmp_path)
    for path in paths:
        (path / MANIFEST).unlink()
    step, messages = _resume_step(tmp_path)
    assert step is None and len(messages) == 3


# ------------------------------------------------------------------------------------------------------------
# Fast: a real process that checkpoints in a loop, SIGKILLed repeatedly (no model)
# ------------------------------------------------------------------------------------------------------------

# Follows the trainer's protocol (tepo.training.Trainer.run/restore): restore the newest intact checkpoint and cut
# the metrics log back to it, then per step: append the metrics row, then save the checkpoint. The "model" is
# 64 MB so that a save takes long enough to be hit; its weights after step s are all equal to s.
_LOOP_DRIVER = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import torch

    from tepo.checkpoint import find_latest_checkpoint, load_checkpoint, save_checkpoint
    from tepo.metrics import MetricsLog, truncate_metrics

    run_dir, steps = Path(sys.argv[1]), int(sys.argv[2])
    model = torch.nn.Linear(4096, 4096, bias=False)
    step = 0
    found = find_latest_checkpoint(run_dir, warn=lambda m: print(m, flush=True))
    if found is not None:
        state = load_checkpoint(found, model)
        step = state["step"]
        assert torch.all(model.weight == step), "restored weights are not those of the checkpoint's step"
        truncate_metrics(run_dir, step)
        print(f"resumed at step {step}", flush=True)
    log = MetricsLog(run_dir)
    while step < steps:
        step += 1
        with torch.no_grad():
            model.weight.fill_(step)
        log.append({"step": step, "value": step * 0.5})
        save_checkpoint(run_dir, step, model, {"step_marker": step}, keep=2)
    print("done", flush=True)
    """
)


def _wait_for_step(
    metrics_path: Path, proc: subprocess.Popen, step: int, timeout_s: float, poll_s: float = 0.005
) -> None:
    """Until the log holds a row for ``step`` (or the process ends, or ``timeout_s`` passes)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if any(row.get("step", 0) >= step for row in read_metrics(metrics_path)):
            return
        time.sleep(poll_s)


# Kill points for the loop test, tied to progress rather than to the clock, so a fast or a loaded machine gets the
# same kinds of kills: inside a checkpoint write, during start-up (imports, restore), and a seeded moment after a
# metrics row is written (between the row and the end of its checkpoint).
LOOP_PLAN = ["write", "startup", "write", "after_row", "write", "after_row"]


def test_checkpoint_loop_survives_repeated_sigkill(tmp_path):
    driver = tmp_path / "driver.py"
    driver.write_text(_LOOP_DRIVER)
    run_dir = tmp_path / "run"
    checkpoints = run_dir / "checkpoints"
    steps, rng = 12, random.Random(6)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    kills = kills_in_write = 0
    latest_before = 0
    for attempt in range(len(LOOP_PLAN) + 1):
        log = open(tmp_path / f"attempt{attempt}.log", "w")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(
            [sys.executable, str(driver), str(run_dir), str(steps)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        mode = LOOP_PLAN[attempt] if attempt < len(LOOP_PLAN) else "finish"
        if mode == "write":
            if _wait_for_temporary(checkpoints, proc, timeout_s=60) is not None:
                time.sleep(rng.uniform(0, 0.02))
        elif mode == "startup":
            time.sleep(rng.uniform(0.05, 0.5))  # importing torch alone takes longer
        elif mode == "after_row":
            _wait_for_step(run_dir / "metrics.jsonl", proc, latest_before + rng.randint(1, 2), timeout_s=60)
            time.sleep(rng.uniform(0, 0.1))
        else:
            proc.wait(timeout=120)
        in_write = bool(list(checkpoints.glob(f"*.tmp-{proc.pid}"))) if checkpoints.exists() else False
        if proc.poll() is None:
            assert _kill_and_reap(proc) == []
            kills += 1
            kills_in_write += in_write
        log.close()
        if proc.returncode == 0:
            break
        assert proc.returncode == -signal.SIGKILL, (tmp_path / f"attempt{attempt}.log").read_text()
        latest = find_latest_checkpoint(run_dir, warn=lambda _m: None)
        latest_step = latest.step if latest else 0
        assert latest_step >= latest_before, "a kill destroyed an intact checkpoint"
        latest_before = latest_step
    else:
        pytest.fail("the loop never finished")
    assert kills == len(LOOP_PLAN) and kills_in_write >= 3, (kills, kills_in_write)
    assert _steps(read_metrics(run_dir / "metrics.jsonl")) == list(range(1, steps + 1))
    assert [row["value"] for row in read_metrics(run_dir / "metrics.jsonl")] == [
        s * 0.5 for s in range(1, steps + 1)
    ]
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_000011", "step_000012"]
    logs = "".join(p.read_text() for p in tmp_path.glob("attempt*.log"))
    assert "partial checkpoint left by an interrupted write" in logs


# ------------------------------------------------------------------------------------------------------------
# Slow: tepo train on the real embedded model, killed and resumed until done
# ------------------------------------------------------------------------------------------------------------

STEPS = 4
TRAIN_ARGS = [
    f"train.steps={STEPS}",
    "train.prompts_per_step=2",
    "rollout.group_size=3",
    "rollout.max_new_tokens=8",
    "train.micro_batch_size=8",
    "eval.size=0",
    "train.save_every=1",
    "train.seed=3",
    "reward.num_workers=1",
    "log.progress=false",
    "optim.lr=1e-4",
    "algorithm.entropy_coef=0.01",  # non-zero gradients whatever the rewards: every step changes the weights
]
# Differ between any two runs by nature (clocks, memory), or count per process rather than per run:
# reward_parse_failures / reward_timeouts_total are the reward pool's lifetime counters, and a resumed run has a
# fresh pool (reported to the trainer's owner; the per-step counts, reward_timeouts etc., are compared).
NOT_COMPARED = {
    "reward/parse_failures_total",
    "reward/timeouts_total",
    "memory/peak_rss_mb",
    "time/logprob_tokens_per_s",
}


def _comparable(rows: list[dict]) -> list[dict]:
    return [
        {k: v for k, v in row.items() if k not in NOT_COMPARED and "seconds" not in k and "per_s" not in k}
        for row in rows
    ]


def _tepo(args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "tepo.cli", "train", *args],
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


# Each rollout backend, as a user runs it. HF generate samples with seeded torch generators in the trainer's process.
# The vLLM engine (a float32 engine here, so that its weights are bit-for-bit the trainer's) samples with a
# per-request seed, and a resumed run starts a new engine from the checkpoint's weights: the same seeds over the
# same weights give the same tokens, so the resumed run is bit-identical too.
BACKENDS = {
    "hf": ["rollout.backend=hf"],
    "vllm": ["rollout.backend=vllm", "rollout.vllm.dtype=float32"],
}


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_sigkilled_training_resumes_to_the_uninterrupted_result(tmp_path, embedded_model_dir, backend):
    if backend == "vllm":
        from tepo.rollout.vllm import VLLMServerError, find_vllm_python

        try:
            find_vllm_python()
        except VLLMServerError as err:
            pytest.skip(f"vLLM is not installed: {err}")
    train_args = [*TRAIN_ARGS, *BACKENDS[backend]]
    # The uninterrupted reference.
    straight = _tepo(
        [f"train.output_dir={tmp_path}", "train.run_name=straight", *train_args], tmp_path / "s.log"
    )
    assert straight.wait(timeout=1200) == 0, (tmp_path / "s.log").read_text()[-3000:]

    # The same run, killed: twice inside a checkpoint write (the first at step 1's save, before any checkpoint
    # exists), three times at seeded random moments (a random delay after a randomly chosen step has been logged,
    # so the kills land in start-up, generation, update or a save whatever the machine's speed); then resumed
    # until it finishes.
    run_dir = tmp_path / "killed"
    checkpoints = run_dir / "checkpoints"
    rng = random.Random(2026)
    plan = ["write", "random", "write", "random", "random"]
    kills, in_write, latest_before, orphans = [], 0, 0, []
    for attempt in range(len(plan) + 3):
        log = tmp_path / f"k{attempt}.log"
        if (run_dir / "config.yaml").exists():
            proc = _tepo(["--resume", str(run_dir)], log)
        else:
            proc = _tepo([f"train.output_dir={tmp_path}", "train.run_name=killed", *train_args], log)
        mode = plan[attempt] if attempt < len(plan) else "none"
        if mode == "write":
            tmp = _wait_for_temporary(checkpoints, proc, timeout_s=600, poll_s=0.02)
            assert tmp is not None, log.read_text()[-3000:]
            time.sleep(rng.uniform(0.0, 1.0))  # a save takes seconds: still inside it
        elif mode == "random":
            target = min(latest_before + rng.randint(1, 2), STEPS - 1)
            _wait_for_step(run_dir / "metrics.jsonl", proc, target, timeout_s=900, poll_s=0.05)
            time.sleep(rng.uniform(0.0, 8.0))
        if mode != "none" and proc.poll() is None:
            writing = bool(list(checkpoints.glob(f"*.tmp-{proc.pid}")))
            orphans += _kill_and_reap(proc)
            latest = find_latest_checkpoint(run_dir, warn=lambda _m: None)
            kills.append({"mode": mode, "in_write": writing, "latest_step": latest.step if latest else 0})
            in_write += writing
            assert kills[-1]["latest_step"] >= latest_before, "a kill destroyed an intact checkpoint"
            latest_before = kills[-1]["latest_step"]
            continue
        assert proc.wait(timeout=1200) == 0, log.read_text()[-3000:]
        break
    print("kills:", json.dumps(kills))
    assert not orphans, f"processes outlived the killed run: {orphans}"
    assert len(kills) >= 4 and in_write >= 2, kills

    a = load_file(str(tmp_path / "straight" / "checkpoints" / f"step_{STEPS:06d}" / "model.safetensors"))
    b = load_file(str(checkpoints / f"step_{STEPS:06d}" / "model.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    initial = load_file(str(embedded_model_dir / "model.safetensors"))
    assert any(not torch.equal(a[k], initial[k]) for k in a), (
        "training changed nothing: comparison is vacuous"
    )

    rows_a = read_metrics(tmp_path / "straight" / "metrics.jsonl")
    rows_b = read_metrics(run_dir / "metrics.jsonl")
    assert _steps(rows_b) == list(range(1, STEPS + 1)), "a step is missing or repeated"
    assert _comparable(rows_a) == _comparable(rows_b)
    assert sorted(p.name for p in checkpoints.iterdir()) == [f"step_{STEPS - 1:06d}", f"step_{STEPS:06d}"]
    logs = "".join(p.read_text() for p in tmp_path.glob("k*.log"))
    assert "partial checkpoint left by an interrupted write" in logs
    summary = {
        "kills": len(kills),
        "kills_in_checkpoint_write": in_write,
        "launches": attempt + 1,
        "rolled_back_rows": len(read_metrics(run_dir / "metrics.rolledback.jsonl")),
    }
    print("crash-resume:", json.dumps(summary))
