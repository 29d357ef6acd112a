"""benchmarks/bench_vs_trl.py --fixed-length (issue #54): tepo's engine then generates exactly max_new_tokens per
response (equal work with TRL's min_new_tokens side), and the benchmark's whole-tree CPU clock counts the vLLM
server's CPU time, which the trainer's own clock misses."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import vllm_python_or_skip

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

pytestmark = pytest.mark.model


def test_fixed_length_makes_every_response_exactly_max_new_tokens_and_the_tree_clock_counts_the_server():
    python = vllm_python_or_skip()
    import time

    from _common import tree_cpu_seconds
    from bench_vs_trl import use_fixed_length

    from tepo.models import load_model_and_tokenizer
    from tepo.rollout.vllm import VLLMRollout

    model, tokenizer = load_model_and_tokenizer(None)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Say hi."}], add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    with VLLMRollout(model, tokenizer, python=python, dtype="bfloat16", kv_cache_gb=0.25) as rollout:
        # Greedy, a short answer ends at EOS well before 48 tokens as the engine normally runs.
        ended = rollout.generate([list(prompt)], num_samples=2, max_new_tokens=48, greedy=True)
        assert ended.response_mask.sum(1).tolist() != [48, 48]
        use_fixed_length(rollout, 48)
        tree_start, own_start = tree_cpu_seconds(), time.process_time()
        fixed = rollout.generate([list(prompt)], num_samples=2, max_new_tokens=48, greedy=True)
        tree, own = tree_cpu_seconds() - tree_start, time.process_time() - own_start
    assert fixed.response_mask.sum(1).tolist() == [48, 48]
    assert tree > own  # the engine computed in the server process, outside the trainer's own clock


def test_fixed_length_refuses_a_backend_without_its_own_engine():
    from bench_vs_trl import use_fixed_length

    with pytest.raises(SystemExit, match="needs the vllm backend"):
        use_fixed_length(object(), 48)


def test_the_tree_memory_sampler_is_off_at_interval_zero_and_samples_otherwise():
    """bench_vs_trl's timed runs must not walk page tables (--pss-interval 0, the default): that slowed the sides
    it measured by 6-13% (docs/performance.md). At an interval > 0 it reports a real peak."""
    import math
    import threading

    from _common import TreeMemorySampler

    before = threading.active_count()
    with TreeMemorySampler(0) as off:
        assert threading.active_count() == before  # no sampling thread at all
    assert math.isnan(off.peak_mb)
    with TreeMemorySampler(0.01) as on:
        time.sleep(0.05)
    assert on.peak_mb > 10  # this Python process alone holds more than 10 MiB


def test_bench_vs_trl_times_without_the_sampler_by_default():
    from bench_vs_trl import build_parser

    assert build_parser().parse_args([]).pss_interval == 0
    assert build_parser().parse_args(["--pss-interval", "0.25"]).pss_interval == 0.25


def test_bench_vs_trl_runs_both_sides_on_every_core_by_default():
    import os

    from bench_vs_trl import build_parser, parse_args

    assert parse_args(build_parser(), []).threads == len(os.sched_getaffinity(0))
    assert parse_args(build_parser(), ["--threads", "1"]).threads == 1


@pytest.mark.slow
def test_bench_vs_trl_runs_both_sides_on_equal_work_and_reports_their_ratio(tmp_path):
    """The whole benchmark, TRL's side included (the baseline of every ratio in docs/performance.md), at a toy
    size: with --fixed-length both sides generate and train on exactly prompts x samples x new-tokens tokens."""
    import json
    import subprocess

    vllm_python_or_skip()
    out = tmp_path / "vs_trl.json"
    size = ["--prompts", "1", "--samples", "2", "--new-tokens", "8"]
    command = [sys.executable, str(BENCHMARKS / "bench_vs_trl.py"), "--variants", "ours,trl", "--rounds", "1"]
    command += ["--warmup", "0", "--steps", "1", "--fixed-length", "--threads", "1", *size, "--json", str(out)]
    printed = subprocess.run(command, capture_output=True, text=True, timeout=1200)
    assert printed.returncode == 0, printed.stdout[-3000:] + printed.stderr[-3000:]
    result = json.loads(out.read_text())
    summary = result["summary"]
    # The file names the code and each side's settings it measured.
    assert result["variants"] == {"ours": [], "trl": {"peft_lora": None}}
    assert result["commit"].removesuffix("+dirty") == _head_commit()
    for side in ("ours", "trl"):
        assert summary[side]["gen_tokens_median"] == 16, (side, summary[side])
        assert summary[side]["step_seconds_median"] > summary[side]["update_seconds_median"] > 0
    assert "ours/trl" in printed.stdout


def _head_commit() -> str:
    return subprocess.run(
        ["git", "-C", str(BENCHMARKS.parent), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_result_files_name_the_commit_they_ran_from_and_whether_it_was_changed(tmp_path, monkeypatch):
    from _common import source_commit

    if not (BENCHMARKS.parent / ".git").exists():
        pytest.skip("not a git checkout")
    assert source_commit().removesuffix("+dirty") == _head_commit()
    # Outside a checkout there is nothing to name.
    monkeypatch.setattr("_common.os.path.abspath", lambda path: str(tmp_path / "benchmarks" / "_common.py"))
    assert source_commit() is None


def test_the_issue54_engine_variant_writes_a_new_weights_file_at_every_sync():
    """bench_vs_trl's baseline keeps the weight sync of the engine issue #54 measured
    (rollout.vllm.keep_weights_file=false): the file is deleted once loaded and created anew by the next sync,
    where tepo's default engine overwrites one file in place."""
    import torch
    from bench_vs_trl import OUR_VARIANTS

    from helpers import tiny_llama
    from tepo.config import load_config
    from tepo.rollout.vllm_weights import EngineWeights

    assert load_config("tepo", OUR_VARIANTS["ours_issue54_engine"]).rollout.vllm.keep_weights_file is False
    assert load_config("tepo", OUR_VARIANTS["ours"]).rollout.vllm.keep_weights_file is True
    model = tiny_llama(0)
    kept = EngineWeights(model, "float32", log=print)
    dropped = EngineWeights(model, "float32", log=print, keep_file=False)
    try:
        inodes = {id(w): w.file.path.stat().st_ino for w in (kept, dropped)}
        for weights in (kept, dropped):
            weights.started()
            assert weights.to_load() is None  # nothing changed since the engine started
        assert kept.file.path.exists() and not dropped.file.path.exists()
        with torch.no_grad():
            next(model.parameters()).add_(1.0)
        for weights in (kept, dropped):
            assert weights.to_load() is not None
            assert weights.file.path.exists()  # written for the engine to load
        assert kept.file.path.stat().st_ino == inodes[id(kept)]
        assert dropped.file.path.stat().st_ino != inodes[id(dropped)]
        for weights in (kept, dropped):
            weights.loaded(weights_version := weights.synced_version, staged=False)
            assert weights.synced_version == weights_version
        assert kept.file.path.exists() and not dropped.file.path.exists()
    finally:
        for weights in (kept, dropped):
            weights.release()
            shutil.rmtree(weights.dir, ignore_errors=True)
