"""Overlapped rollouts (``rollout.async_steps=1``) with the real vLLM engine and the embedded model: the next batch
is sampled during the update (policy lag 1), a checkpoint taken with a batch in flight records the stream position
before it, and a resumed run neither loses nor repeats a step."""

from __future__ import annotations

import shutil

import pytest
import torch

from helpers import vllm_python_or_skip
from tepo.checkpoint import find_latest_checkpoint
from tepo.config import load_config, save_config
from tepo.metrics import read_metrics
from tepo.training import Trainer, resume


@pytest.mark.model
@pytest.mark.slow  # a real overlapped run with a kill and a resume: 134 s of the default suite's 17 min (2026-12-05)
def test_async_run_samples_one_step_behind_and_resumes_without_losing_a_step(tmp_path, embedded_model_dir):
    python = vllm_python_or_skip()
    prompts = 2
    config = load_config(
        "default",
        [
            f"train.output_dir={tmp_path}",
            "rollout.backend=vllm",
            f"rollout.vllm.python={python}",
            "rollout.async_steps=1",
            "train.steps=3",
            f"train.prompts_per_step={prompts}",
            "rollout.group_size=3",
            "rollout.max_new_tokens=8",
            "eval.size=2",
            "eval.samples=0",
            "eval.every=1",  # an evaluation between steps needs the engine while a batch is in flight
            "train.micro_batch_size=6",
            "train.save_every=2",
            "train.keep_last=2",
            "reward.num_workers=1",
            "log.progress=false",
            "log.samples_every=0",
            "algorithm.entropy_coef=0.01",  # a non-zero gradient whatever the rewards
        ],
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    save_config(config, run_dir / "config.yaml")  # as `tepo train` does, so that the run can be resumed
    trainer = Trainer(config, run_dir, log=lambda *_: None).setup()
    server = trainer.rollout._proc
    result = trainer.run()
    assert result.steps_done == 3
    assert server.poll() is not None, "the vLLM server outlived the run"
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["rollout/policy_lag"] for r in rows] == [0, 1, 1]
    assert all(r["rollout/gen_tokens"] > 0 and r["update/optimizer_updates"] == 1 for r in rows)
    assert "eval/greedy_accuracy" in rows[0] and "eval/greedy_accuracy" in rows[1]
    # The engine samples the staged pre-update weights: a step with lag 1 still reports the sampler/trainer gap.
    assert all("mismatch/kl_k3" in r for r in rows)

    # The step-2 checkpoint was written while step 3's batch was in flight: it records the stream position after
    # step 2's prompts, not after step 3's.
    state = torch.load(run_dir / "checkpoints" / "step_000002" / "state.pt", weights_only=True)
    assert state["stream"] == {"epoch": 0, "offset": 2 * prompts}

    # As if killed after step 2's checkpoint: the run resumes there and redoes step 3, sampled now (lag 0).
    shutil.rmtree(run_dir / "checkpoints" / "step_000003")
    assert find_latest_checkpoint(run_dir, warn=lambda _m: None).step == 2
    again = resume(run_dir, log=lambda *_: None)
    assert again.steps_done == 3
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3], "a step is missing or repeated"
    assert rows[2]["rollout/policy_lag"] == 0
    assert [r["step"] for r in read_metrics(run_dir / "metrics.rolledback.jsonl")] == [3]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["rollout.async_steps=2"], r"rollout.async_steps: expected 0 \(sample, then update\) or 1"),
        (
            ["rollout.async_steps=1", "rollout.backend=hf"],
            r"rollout.async_steps: 1 samples while the model trains.*hf",
        ),
    ],
)
def test_async_settings_that_cannot_run_are_refused_before_any_model_loads(overrides, message):
    from tepo.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        load_config("default", overrides)


def test_overlap_on_two_cpu_cores_gets_a_note_that_sync_is_faster_there():
    from tepo.training.overlap import overlap_cores_note

    for cores in (1, 2):
        note = overlap_cores_note(cores, engine_on_gpu=False)
        assert note is not None and f"on {cores} CPU core" in note and "async_steps=0" in note
    assert overlap_cores_note(8, engine_on_gpu=False) is None  # cores to spare: no note
    assert overlap_cores_note(2, engine_on_gpu=True) is None  # the engine has a device of its own
