"""Training-time evaluation on a named benchmark uses that benchmark's protocol, so it agrees with ``tepo eval``:
the same prompts reach the same real model, and the same verdicts come back."""

from __future__ import annotations

import pytest

from tepo.config import load_config
from tepo.evaluate.benchmarks import resolve_benchmark
from tepo.evaluate.runner import BenchmarkTask, evaluate_benchmarks
from tepo.evaluate.settings import make_setting
from tepo.rewards import RewardPool
from tepo.rollout.hf import HFRollout
from tepo.training.evaluation import evaluate_held_out, held_out_protocol

pytestmark = [pytest.mark.model, pytest.mark.usefixtures("one_torch_thread")]


class _Recorder:
    """The real HF rollout, with a record of every generate call (prompt token ids and decoding settings)."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []
        self.pad_token_id = inner.pad_token_id

    def generate(self, prompt_ids, **kw):
        self.calls.append((prompt_ids, kw.get("greedy"), kw["max_new_tokens"]))
        self.batch = self.inner.generate(prompt_ids, **kw)
        return self.batch


def test_training_eval_on_a_benchmark_matches_tepo_eval(embedded_model, tmp_path):
    model, tokenizer = embedded_model
    config = load_config(
        "default", ["eval.source=math500", "eval.size=2", "eval.samples=0", "eval.max_new_tokens=6"]
    )
    assert held_out_protocol(config)["answer_format"] == "boxed"
    problems = resolve_benchmark("math500")[:2]
    with RewardPool(num_workers=1, timeout_s=10.0) as pool:
        during_training = _Recorder(HFRollout(model, tokenizer))
        ours = evaluate_held_out(during_training, tokenizer, problems, pool, config)
        standalone = _Recorder(HFRollout(model, tokenizer))
        report = evaluate_benchmarks(
            standalone,
            tokenizer,
            [BenchmarkTask("math500", problems, make_setting(max_new_tokens=6))],
            tmp_path / "eval",
            model_info={"name": "embedded"},
            pool=pool,
            progress=False,
            log=lambda *_: None,
        )
    assert during_training.calls == standalone.calls, "training-time eval prompted the model differently"
    assert during_training.batch.texts == standalone.batch.texts
    assert ours["eval/greedy_accuracy"] == report.results["benchmarks"]["math500"]["accuracy"]


def test_training_eval_on_the_training_task_keeps_the_training_prompt():
    config = load_config("default", ["data.instruction=Answer with a number."])
    assert held_out_protocol(config) == {"instruction": "Answer with a number.", "answer_format": None}


@pytest.mark.parametrize("batch_prompts, expected_calls", [(None, [3]), (2, [2, 1]), (1, [1, 1, 1])])
def test_eval_batch_prompts_sets_prompts_per_generate_call(embedded_model, batch_prompts, expected_calls):
    """``eval.batch_prompts`` fixes how the held-out set is cut into generate calls (batching moves bf16 answers
    and each call's seed, so a study reproducing earlier runs pins it); unset, HF generate keeps 16 a call."""
    model, tokenizer = embedded_model
    overrides = ["eval.source=math500", "eval.size=3", "eval.samples=0", "eval.max_new_tokens=2"]
    if batch_prompts is not None:
        overrides.append(f"eval.batch_prompts={batch_prompts}")
    config = load_config("default", overrides)
    problems = resolve_benchmark("math500")[:3]
    recorder = _Recorder(HFRollout(model, tokenizer))
    with RewardPool(num_workers=1, timeout_s=10.0) as pool:
        evaluate_held_out(recorder, tokenizer, problems, pool, config)
    assert [len(prompts) for prompts, _, _ in recorder.calls] == expected_calls


def test_eval_batch_prompts_must_be_positive():
    from tepo.config import ConfigError

    with pytest.raises(ConfigError, match=r"eval\.batch_prompts"):
        load_config("default", ["eval.batch_prompts=0"])
