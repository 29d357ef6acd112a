"""tepo eval on the real embedded model: files and metrics agree, resume redoes only missing problems, run dirs."""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch

from tepo.data import build_prompt_ids
from tepo.evaluate import BenchmarkTask, evaluate_benchmarks, resolve_benchmark
from tepo.evaluate.settings import EvalSetting
from tepo.rewards import RewardPool
from tepo.rollout import HFRollout

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SHARED = Path(os.environ.get("TEPO_DATA_DIR", "../shared/data"))  # set by conftest.py
EMBEDDED_INFO = {"spec": "embedded", "kind": "embedded", "base_model": None, "checkpoint": None}
EASY = [
    ("What is 2+3?", "5"),
    ("What is 7 times 6?", "42"),
    ("Compute 10-4.", "6"),
    ("What is half of 8?", "4"),
]


@pytest.fixture(scope="module")
def pool():
    with RewardPool(num_workers=2, timeout_s=10.0) as p:
        yield p


class CountingBackend:
    """The real HFRollout, with a record of every generate call (to see which problems were generated)."""

    def __init__(self, backend):
        self.backend = backend
        self.calls: list[list[list[int]]] = []

    def generate(self, prompt_ids, **kw):
        self.calls.append([list(p) for p in prompt_ids])
        return self.backend.generate(prompt_ids, **kw)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _easy_file(tmp_path: Path) -> Path:
    path = tmp_path / "easy.jsonl"
    path.write_text(
        "".join(
            json.dumps({"id": f"easy-{i}", "problem": q, "answer": a}) + "\n" for i, (q, a) in enumerate(EASY)
        )
    )
    return path


@pytest.mark.model
@pytest.mark.skipif(not (SHARED / "gsm8k" / "test.jsonl").is_file(), reason="shared data not present")
def test_real_gsm8k_eval_writes_consistent_samples_and_results(embedded_model, pool, tmp_path):
    model, tokenizer = embedded_model
    problems = resolve_benchmark("gsm8k", SHARED)[:3]
    setting = EvalSetting(max_new_tokens=24)
    backend = CountingBackend(HFRollout(model, tokenizer))
    report = evaluate_benchmarks(
        backend,
        tokenizer,
        [BenchmarkTask("gsm8k", problems, setting, "gsm8k")],
        tmp_path,
        model_info=EMBEDDED_INFO,
        pool=pool,
        batch_size=2,
        progress=False,
    )
    assert [len(c) for c in backend.calls] == [2, 1]

    lines = _lines(tmp_path / "samples.jsonl")
    assert [(r["benchmark"], r["index"], r["id"], r["gold"]) for r in lines] == [
        ("gsm8k", i, p.id, p.answer) for i, p in enumerate(problems)
    ]
    responses = [resp for r in lines for resp in r["responses"]]
    assert len(responses) == 3 and all(resp["text"] for resp in responses)
    for resp in responses:
        assert 1 <= resp["tokens"] <= 24
        assert not resp["truncated"] or resp["tokens"] == 24
        assert (resp["status"] == "no_answer") == (resp["extracted"] is None)
    # Verdicts are reproducible from the stored text and gold answer alone.
    again = pool.score(
        [resp["text"] for resp in responses], [r["gold"] for r in lines], answer_format="boxed"
    )
    assert [v.status for v in again] == [resp["status"] for resp in responses]

    # results.json is what the sample lines say, recomputed here by hand.
    results = json.loads((tmp_path / "results.json").read_text())
    assert results == report.results
    got = results["benchmarks"]["gsm8k"]
    assert got["num_problems"] == 3 and got["samples_per_problem"] == 1
    assert got["greedy_accuracy"] == pytest.approx(sum(r["status"] == "correct" for r in responses) / 3)
    assert got["boxed_rate"] == pytest.approx(
        sum("\\boxed{" in r["text"] and r["boxed"] for r in responses) / 3
    )
    assert got["mean_response_tokens"] == pytest.approx(sum(r["tokens"] for r in responses) / 3)
    assert got["truncated_rate"] == pytest.approx(sum(r["truncated"] for r in responses) / 3)
    assert got["statuses"] == dict(Counter(r["status"] for r in responses))
    assert got["settings"]["max_new_tokens"] == 24 and got["settings"]["greedy"] is True
    assert results["model"]["spec"] == "embedded"


@pytest.mark.model
def test_resume_redoes_only_the_missing_problems_and_matches_an_uninterrupted_run(
    embedded_model, pool, tmp_path
):
    model, tokenizer = embedded_model
    problems = resolve_benchmark(str(_easy_file(tmp_path)))
    setting = EvalSetting(
        greedy=False, num_samples=2, temperature=0.8, max_new_tokens=16, seed=7, answer_format="boxed_or_last"
    )
    task = BenchmarkTask("easy", problems, setting)

    def run(out: Path) -> tuple[CountingBackend, object]:
        backend = CountingBackend(HFRollout(model, tokenizer))
        report = evaluate_benchmarks(
            backend,
            tokenizer,
            [task],
            out,
            model_info=EMBEDDED_INFO,
            pool=pool,
            batch_size=1,
            pass_k=[1, 2],
            progress=False,
            log=lambda _msg: None,
        )
        return backend, report

    full_dir, resumed_dir = tmp_path / "full", tmp_path / "resumed"
    backend, full = run(full_dir)
    assert len(backend.calls) == 4

    # An evaluation killed while writing problem 1: problem 0's line is complete, problem 1's is torn.
    resumed_dir.mkdir()
    shutil.copy(full_dir / "eval_settings.json", resumed_dir)
    text = (full_dir / "samples.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    (resumed_dir / "samples.jsonl").write_text(text[0] + text[1][: len(text[1]) // 2], encoding="utf-8")

    backend, resumed = run(resumed_dir)
    prompts = build_prompt_ids(tokenizer, problems, setting.instruction)
    assert backend.calls == [[prompts[i]] for i in (1, 2, 3)]  # problem 0 was not generated again
    assert [(o.generated, o.resumed) for o in resumed.outcomes] == [(3, 1)]
    # Seeds follow the batch index, so the resumed samples are those of the uninterrupted run.
    assert _lines(resumed_dir / "samples.jsonl") == _lines(full_dir / "samples.jsonl")
    assert resumed.results["benchmarks"] == full.results["benchmarks"]
    metrics = full.results["benchmarks"]["easy"]
    assert set(metrics["pass@k"]) == {"1", "2"} and metrics["avg@2"] == metrics["pass@k"]["1"]

    backend, _ = run(resumed_dir)  # everything is done: nothing to generate
    assert backend.calls == []


@pytest.mark.model
def test_run_directory_model_argument(embedded_model_dir, tmp_path, capsys):
    from tepo.checkpoint import save_checkpoint
    from tepo.cli import main
    from tepo.evaluate.loading import describe_model, load_eval_model
    from tepo.models import load_model_and_tokenizer

    # A training run whose checkpoint differs from the base model in one known tensor.
    trained, _ = load_model_and_tokenizer(embedded_model_dir)
    with torch.no_grad():
        trained.model.norm.weight.mul_(0.5)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("model:\n  name: null\n  trust_remote_code: false\n")
    save_checkpoint(run_dir, 3, trained, {"note": torch.zeros(1)})
    save_checkpoint(run_dir, 5, trained, {"note": torch.zeros(1)})
    expected_norm = trained.model.norm.weight.detach().clone()
    del trained

    info = describe_model(str(run_dir))
    assert (info["kind"], info["step"], info["base_model"]) == ("run", 5, None)
    model, _, _ = load_eval_model(str(run_dir))
    assert torch.equal(model.model.norm.weight, expected_norm)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied again
    del model

    easy = _easy_file(tmp_path)
    out = tmp_path / "eval"
    argv = [
        "eval",
        "--model",
        str(run_dir),
        "--bench",
        str(easy),
        "--limit",
        "1",
        "--max-new-tokens",
        "4",
        "--output-dir",
        str(out),
        "--no-progress",
        "--device",
        "cpu",
        "--rollout",
        "hf",  # this test is about loading a run directory; the vLLM engine has tests of its own
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| easy " in printed and "results.json" in printed
    results = json.loads((out / "results.json").read_text())
    assert (results["model"]["kind"], results["model"]["step"]) == ("run", 5)
    assert results["benchmarks"]["easy"]["num_problems"] == 1

    # A single checkpoint directory works too; an empty run directory is one clear error.
    step3 = run_dir / "checkpoints" / "step_000003"
    assert describe_model(str(step3))["step"] == 3
    empty = tmp_path / "empty_run"
    empty.mkdir()
    (empty / "config.yaml").write_text("model:\n  name: null\n")
    assert (
        main(["eval", "--model", str(empty), "--bench", str(easy), "--output-dir", str(tmp_path / "x")]) == 2
    )
    assert "has no intact checkpoint" in capsys.readouterr().err
