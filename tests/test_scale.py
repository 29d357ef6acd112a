"""Past the toy: real data, real batch shapes and longer responses through the default engine (issue #23).

Everything before this file ran 4 prompts x 8 samples x 64 tokens of single-digit arithmetic, which is why the
first realistic batch crashed the engine unseen (tests/rollout/test_rollout_vllm.py has that crash on its smallest batch).
Here: GSM8K rows from $TEPO_DATA_DIR through `tepo train`; `tepo eval --protocol tepo` over all seven of its
benchmarks with vLLM, sampled avg@32 included; the paper's batch shape through the vLLM server. Each asserts
success, finite metrics and the shapes, never a time. All are `-m slow`; the default suite's short version is
tests/rollout/test_rollout_vllm.py::test_a_batch_past_the_engines_step_budget_is_sampled_reproducibly (the crash on the
smallest batch that caused it, on the real engine).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from helpers import vllm_python_or_skip

pytestmark = pytest.mark.model


def _data_dir() -> Path:
    data = os.environ.get("TEPO_DATA_DIR")
    if not data or not (Path(data) / "gsm8k" / "train.jsonl").is_file():
        pytest.skip("needs $TEPO_DATA_DIR with gsm8k/train.jsonl (.ci/run points it at shared/data)")
    return Path(data)


def _train(tmp_path, *overrides: str) -> tuple[list[dict], dict]:
    """`tepo train --data <GSM8K train rows>` on the default engine; its metrics rows and summary."""
    from tepo.cli import main
    from tepo.metrics import read_metrics

    vllm_python_or_skip()
    data = _data_dir() / "gsm8k" / "train.jsonl"
    argv = ["train", "--data", str(data), "--output-dir", str(tmp_path), "log.progress=false", *overrides]
    assert main(argv) == 0
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    return read_metrics(run_dir / "metrics.jsonl"), json.loads((run_dir / "summary.json").read_text())


def _assert_finite_step(row: dict, *, rows: int, max_new_tokens: int, entropy_term: bool = False) -> None:
    numbers = {k: v for k, v in row.items() if isinstance(v, float)}
    bad = {k: v for k, v in numbers.items() if not math.isfinite(v)}
    assert not bad, f"non-finite metrics: {bad}"
    assert 0 < row["rollout/response_length_max"] <= max_new_tokens
    assert row["rollout/num_sequences"] == rows and row["rollout/gen_tokens"] > 0
    assert math.isfinite(row["update/loss"])
    if entropy_term or row["reward/std"] > 0:
        assert row["update/grad_norm"] > 0
    else:  # every response scored alike (all 0 happens at 256 tokens): zero advantages, so exactly no gradient
        assert row["update/grad_norm"] == 0 and row["update/loss"] == 0
    assert row["update/optimizer_updates"] >= 1


@pytest.mark.slow
def test_gsm8k_training_step_with_prompts_past_one_engine_step(tmp_path):
    """16 GSM8K prompts x 3 samples hold about 4,900 prompt tokens, past vLLM's 4096-token step on CPU: the batch
    that crashed `tepo train` before, through the whole trainer. (Slow-marked: 14 min on the loaded machine it was
    written on. The default suite has the crash itself on its smallest batch in tests/rollout/test_rollout_vllm.py.)"""
    rows, _ = _train(
        tmp_path,
        "train.prompts_per_step=16",
        "rollout.group_size=3",
        "rollout.max_new_tokens=16",
        "train.steps=1",
        "eval.size=0",
        "train.save_final=false",
        "algorithm.entropy_coef=0.01",  # a non-zero gradient whatever the rewards
    )
    assert len(rows) == 1
    _assert_finite_step(rows[0], rows=48, max_new_tokens=16, entropy_term=True)


@pytest.mark.slow
def test_gsm8k_training_at_16_prompts_8_samples_256_tokens(tmp_path):
    """The issue's realistic shape: 16 prompts x 8 samples x 256 tokens for 2 steps, held-out evaluation included."""
    rows, summary = _train(
        tmp_path,
        "train.prompts_per_step=16",
        "rollout.group_size=8",
        "rollout.max_new_tokens=256",
        "train.steps=2",
        "eval.size=16",
        "train.save_final=false",
    )
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        _assert_finite_step(row, rows=128, max_new_tokens=256)
    assert 0.0 <= summary["after"]["eval_greedy_accuracy"] <= 1.0


@pytest.mark.slow
def test_tepo_protocol_over_all_seven_benchmarks_with_vllm(tmp_path, capsys):
    """`tepo eval --protocol tepo --limit 4` on the vLLM engine: greedy on four benchmarks, avg@32 at temperature
    0.6 on AIME24/25 and AMC23 (4 x 32 = 128 rows a call). Omni-MATH is not in shared/data: a data directory is made
    of links to the six that are, plus Omni-MATH rows shaped like the hub's (tests/fixtures/hub/omni_math.jsonl)."""
    from tepo.cli import main
    from tepo.evaluate.settings import TEPO_BENCHMARKS

    vllm_python_or_skip()
    shared = _data_dir()
    data = tmp_path / "data"
    for folder in ("math500", "aime24", "aime25", "amc23", "minerva_math", "olympiadbench"):
        (data / folder).mkdir(parents=True)
        (data / folder / "test.jsonl").symlink_to(shared / folder / "test.jsonl")
    (data / "omni_math").mkdir()
    fixture = Path(__file__).parent / "fixtures" / "hub" / "omni_math.jsonl"
    (data / "omni_math" / "test.jsonl").write_text(fixture.read_text())
    out = tmp_path / "eval"
    argv = ["eval", "--protocol", "tepo", "--limit", "4", "--max-new-tokens", "48", "--data-dir", str(data)]
    assert main([*argv, "--output-dir", str(out), "--no-progress", "--dtype", "bfloat16"]) == 0
    results = json.loads((out / "results.json").read_text())["benchmarks"]
    assert set(results) == set(TEPO_BENCHMARKS)
    for name, result in results.items():
        sampled = name in ("aime24", "aime25", "amc23")
        assert result["settings"]["num_samples"] == (32 if sampled else 1), name
        assert result["num_problems"] == (3 if name == "omni_math" else 4)
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(records) == 4 * 6 + 3
    assert all(
        len(r["responses"]) == (32 if r["benchmark"] in ("aime24", "aime25", "amc23") else 1) for r in records
    )


@pytest.mark.slow
def test_the_papers_batch_shape_through_the_vllm_server(embedded_model):
    """TEPO's rollout: 64 prompts x 8 samples (512 rows) in one generate, 128 new tokens, seeded, with the
    sampler's log-probs, on GSM8K prompts."""
    import torch

    from tepo.data import build_prompt_ids
    from tepo.data.loading import load_problems
    from tepo.rollout.vllm import VLLMRollout

    python = vllm_python_or_skip()
    model, tokenizer = embedded_model
    problems = load_problems(str(_data_dir() / "gsm8k" / "train.jsonl"))[:64]
    prompts = build_prompt_ids(tokenizer, problems, "Give the final answer as a number.")
    with VLLMRollout(model, tokenizer, python=python) as engine:
        batch = engine.generate(prompts, num_samples=8, max_new_tokens=128, seed=3, return_logprobs=True)
    assert batch.input_ids.shape[0] == 512 and batch.response_len <= 128
    assert batch.prompt_index.tolist() == [g for g in range(64) for _ in range(8)]
    mask = batch.response_mask.bool()
    assert mask.any(1).all() and torch.isfinite(batch.rollout_logp[mask]).all()
    assert batch.num_generated_tokens == int(batch.response_mask.sum())
