"""End-to-end training on the real embedded model (SmolLM2-135M-Instruct): tiny, a few steps, CPU."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from safetensors.torch import load_file

from helpers import small_run_overrides
from tepo.config import load_config
from tepo.metrics import read_metrics
from tepo.training import resume, train

pytestmark = pytest.mark.model

# Keys ALGORITHMS.md "What to log" asks for, under the names the log writes (grouped by phase, tepo.metrics.names).
REQUIRED_KEYS = {
    "step",
    "reward/mean",
    "reward/std",
    "reward/accuracy",
    "rollout/frac_groups_dropped",
    "rollout/response_length_mean",
    "rollout/response_length_max",
    "rollout/frac_truncated",
    "update/entropy_mean",
    "update/clip_frac_low",
    "update/clip_frac_high",
    "update/approx_kl",
    "update/grad_norm",
    "update/lr",
    "time/gen_seconds",
    "time/gen_tokens_per_s",
    "time/logprob_seconds",
    "time/update_seconds",
    "time/update_tokens_per_s",
    "memory/peak_rss_mb",
    "time/step_seconds",
    "reward/timeouts",
    "update/loss",
}
TIMING_KEYS = {k for k in REQUIRED_KEYS if k.startswith(("time/", "memory/"))} | {
    "time/logprob_tokens_per_s",
    "time/reward_seconds",
    "time/eval_seconds",
}


def tiny(tmp_path, *extra):
    # keep_last 1: the tests read only the last checkpoint; each is 1.6 GB of disk
    return load_config("default", small_run_overrides(tmp_path, "train.steps=2", "train.keep_last=1", *extra))


def test_two_steps_train_log_and_change_parameters(tmp_path, embedded_model_dir):
    # An entropy bonus makes the gradient non-zero whatever the (random) rewards are, so "parameters change"
    # cannot pass by luck or fail by an all-zero-reward batch.
    config = tiny(tmp_path, "train.run_name=e2e", "algorithm.entropy_coef=0.01", "optim.lr=1e-4")
    result = train(config, log=lambda *_: None)
    run = result.run_dir
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert set(row) >= REQUIRED_KEYS, REQUIRED_KEYS - set(row)
        assert math.isfinite(row["update/loss"]) and math.isfinite(row["update/grad_norm"])
        assert row["update/optimizer_updates"] == 1 and row["rollout/num_sequences"] == 6
    initial = load_file(str(embedded_model_dir / "model.safetensors"))
    trained = load_file(str(run / "checkpoints" / "step_000002" / "model.safetensors"))
    changed = [k for k in trained if not torch.equal(trained[k], initial[k])]
    assert len(changed) > len(trained) // 2, f"only {len(changed)} of {len(trained)} tensors changed"
    summary = json.loads((run / "summary.json").read_text())
    for phase in ("before", "after"):
        assert 0.0 <= summary[phase]["eval_greedy_accuracy"] <= 1.0
        # Each held-out problem's outcome is on disk (tepo.evaluate.records), and they add up to the score.
        records = [
            json.loads(line) for line in (run / "held_out" / f"{phase}.jsonl").read_text().splitlines()
        ]
        assert len(records) == config.eval.size and len({r["key"] for r in records}) == config.eval.size
        assert (
            sum(r["greedy_correct"] for r in records) / len(records) == summary[phase]["eval_greedy_accuracy"]
        )
        assert all(r["samples"] == config.eval.samples for r in records)
    # The run records the precision auto resolved to on this machine (tepo.precision): in the summary, in
    # precision.json, and as config.yaml's values with the reason above them.
    from tepo.precision import native_bf16

    native = native_bf16("cpu").native
    assert summary["precision"]["model_autocast_bf16"] is native
    assert summary["precision"]["vllm_dtype"] == ("bfloat16" if native else "float32")
    assert json.loads((run / "precision.json").read_text()) == summary["precision"]
    saved = (run / "config.yaml").read_text()
    assert saved.startswith("# precision: ") and f"autocast_bf16: {str(native).lower()}" in saved


def test_ep_grpo_gives_all_equal_groups_a_gradient_after_the_first_update_and_pass_at_k_is_scored(tmp_path):
    # EP-GRPO's zero-variance fallback needs old != ref: at step 1 the policy that sampled is the reference, so
    # an all-equal group gets exactly 0 (s~ = 0, A_i = 0); after one update it gets a signal. With 8 new tokens
    # the embedded model almost never answers, so nearly every group is all-wrong (asserted, not assumed); an
    # entropy bonus makes step 1 move the policy even then (all-equal rewards alone give EP-GRPO no gradient yet).
    config = tiny(
        tmp_path,
        "train.run_name=ep",
        "algorithm.advantage=ep_grpo",
        "algorithm.entropy_coef=0.01",
        "optim.lr=1e-4",
        "eval.pass_k_samples=2",
    )
    run = train(config, log=lambda *_: None).run_dir
    rows = read_metrics(run / "metrics.jsonl")
    shares = [r["reward/frac_groups_all_equal"] for r in rows]
    assert all(0.0 <= s <= 1.0 for s in shares) and shares[1] > 0, shares
    advantaged = [r["reward/frac_all_equal_tokens_advantaged"] for r in rows]
    assert shares[0] == 0 or advantaged[0] == 0.0, advantaged
    assert advantaged[1] > 0, advantaged  # the gate is never 0: a token whose bucket pool has a spread moves
    summary = json.loads((run / "summary.json").read_text())
    for phase in ("before", "after"):
        scores = summary[phase]
        assert 0.0 <= scores["eval_pass@1"] <= scores["eval_pass@2"] <= 1.0, scores
        assert "eval_pass@4" not in scores
    assert (
        json.loads((run / "eval_before.json").read_text())["eval_pass@2"] == summary["before"]["eval_pass@2"]
    )


def _comparable(rows):
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows]


def test_resume_equals_uninterrupted_run(tmp_path):
    common = ["eval.size=0", "train.steps=3", "optim.lr=1e-4", "algorithm.entropy_coef=0.01"]
    straight = train(tiny(tmp_path, "train.run_name=straight", *common), log=lambda *_: None).run_dir
    a = load_file(str(straight / "checkpoints" / "step_000003" / "model.safetensors"))
    rows_a = read_metrics(straight / "metrics.jsonl")
    shutil.rmtree(straight / "checkpoints")  # 1.6 GB each: keep the suite's peak disk use to two checkpoints
    stopped = train(
        tiny(tmp_path, "train.run_name=stopped", *common[:1], "train.steps=2", *common[2:]),
        log=lambda *_: None,
    ).run_dir
    messages = []
    result = resume(stopped, ["train.steps=3"], log=messages.append)
    resumed = result.run_dir
    assert any("resumed" in m and "step 2" in m for m in messages)
    # summary.json is the summary the run returns, the resume included
    assert result.summary["resumed"] is True
    assert json.loads((resumed / "summary.json").read_text()) == result.summary
    b = load_file(str(resumed / "checkpoints" / "step_000003" / "model.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    rows_b = read_metrics(resumed / "metrics.jsonl")
    assert [r["step"] for r in rows_b] == [1, 2, 3]
    assert _comparable(rows_a) == _comparable(rows_b)


@pytest.mark.slow  # two real runs of the embedded model (minutes); the LoRA + vLLM run in test_rollout_parity is default
def test_lora_run_resumes_exactly_and_evaluates_merged(tmp_path):
    """``tepo train model.lora.rank=16`` on the embedded model: a run stopped after 1 step and resumed ends
    bit-identical to an uninterrupted 2-step run; checkpoints hold the adapters; eval loads the merged model."""
    pytest.importorskip("peft")
    from tepo.evaluate.loading import load_eval_model
    from tepo.models import load_model_and_tokenizer

    targets = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
    common = ["model.lora.rank=16", "model.lora.alpha=32", f"model.lora.target_modules={targets}"]
    common += ["eval.size=0", "optim.lr=1e-3", "algorithm.kl_coef=0.01", "algorithm.entropy_coef=0.01"]
    messages = []
    straight = train(tiny(tmp_path, "train.run_name=straight", "train.steps=2", *common), log=messages.append)
    assert any("LoRA rank 16" in m for m in messages)
    final = straight.run_dir / "checkpoints" / "step_000002"
    a = load_file(str(final / "model.safetensors"))
    assert a and all(".lora_A." in k or ".lora_B." in k for k in a)
    assert (final / "model.safetensors").stat().st_size < 30e6  # 4.9M adapter parameters, not 135M
    assert any(float(t.abs().max()) > 0 for k, t in a.items() if "lora_B" in k)  # trained
    rows_a = read_metrics(straight.run_dir / "metrics.jsonl")

    stopped = train(tiny(tmp_path, "train.run_name=stopped", "train.steps=1", *common), log=lambda *_: None)
    messages = []
    resumed = resume(stopped.run_dir, ["train.steps=2"], log=messages.append).run_dir
    assert any("resumed" in m and "step 1" in m for m in messages)
    b = load_file(str(resumed / "checkpoints" / "step_000002" / "model.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert _comparable(rows_a) == _comparable(read_metrics(resumed / "metrics.jsonl"))
    shutil.rmtree(resumed / "checkpoints")

    merged, _, info = load_eval_model(straight.run_dir)
    assert info["kind"] == "run" and not hasattr(merged, "peft_config")
    base, _ = load_model_and_tokenizer(None)
    state, reference = merged.state_dict(), base.state_dict()
    q = "model.layers.0.self_attn.q_proj.weight"
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    delta = (32 / 16) * a[f"{prefix}.lora_B.default.weight"] @ a[f"{prefix}.lora_A.default.weight"]
    torch.testing.assert_close(state[q], reference[q] + delta)
    assert torch.equal(state["model.norm.weight"], reference["model.norm.weight"])


def test_a_token_budget_run_on_the_real_model_matches_fixed_rows(tmp_path):
    """`tepo train train.micro_batch_tokens=...` through the whole trainer: the start-up log names the layout, and
    one step's loss and gradient norm equal the fixed-row run's up to the order of float sums (the same rollouts:
    same seed, same sampler), while the update computes no more padding."""
    common = ["train.steps=1", "eval.size=0", "train.save_every=0", "train.save_final=false"]
    fixed = train(tiny(tmp_path, "train.run_name=fixed", *common), log=lambda *_: None).run_dir
    messages = []
    budget = train(
        tiny(tmp_path, "train.run_name=budget", "train.micro_batch_tokens=96", *common), log=messages.append
    ).run_dir
    assert any("micro-batches: rows sorted by length, at most 96 computed tokens" in str(m) for m in messages)
    (a,), (b,) = read_metrics(fixed / "metrics.jsonl"), read_metrics(budget / "metrics.jsonl")
    assert a["rollout/num_sequences"] == b["rollout/num_sequences"] and a["reward/mean"] == b["reward/mean"]
    assert b["update/padding_share"] <= a["update/padding_share"]
    # bf16 autocast where the CPU has it: per-row results may round differently in differently shaped batches.
    assert b["update/loss"] == pytest.approx(a["update/loss"], rel=2e-2, abs=1e-4)
    assert b["update/grad_norm"] == pytest.approx(a["update/grad_norm"], rel=2e-2)
