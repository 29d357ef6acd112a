"""``tepo eval``'s engine: score benchmarks into ``samples.jsonl``, resume what is there, write ``results.json``.

Output directory layout:

- ``eval_settings.json``: the model (its spec and checkpoint) and each benchmark's decoding/judging setting. A later
  run into the same directory must match them for the benchmarks it shares (else samples of different settings
  would be mixed); ``overwrite=True`` starts from scratch instead.
- ``samples.jsonl``: one line per finished problem (:mod:`tepo.evaluate.samples`), appended batch by batch.
- ``results.json``: per benchmark its metrics (:mod:`tepo.evaluate.metrics`), computed from the records of
  ``samples.jsonl`` alone, with the setting and data source; benchmarks of earlier runs into the same directory are
  kept.

Resume: problems whose record is already in ``samples.jsonl`` are not generated again. Batches are the problems
``[b * batch_size, (b + 1) * batch_size)`` of the benchmark, generated with seed ``setting.seed + b`` whether or not
earlier batches ran in this process, so an interrupted and resumed evaluation draws the same samples as an
uninterrupted one with the same batch size (transformers' sampling is deterministic given the seed on CPU; GPU
kernels may not be).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from tepo.data import Problem
from tepo.evaluate.core import engine_batch_prompts, score_problems
from tepo.evaluate.metrics import benchmark_metrics
from tepo.evaluate.samples import SAMPLES_FILE, append_samples, problem_record, read_samples
from tepo.evaluate.settings import DEFAULT_PASS_K, EvalError, EvalSetting
from tepo.files import atomic_write_text
from tepo.rewards import FAILURES_FILE
from tepo.rollout.base import RolloutError

SETTINGS_FILE = "eval_settings.json"
RESULTS_FILE = "results.json"


@dataclass
class BenchmarkTask:
    """One benchmark to evaluate: its name (the key in the output files), problems, setting and data source."""

    name: str
    problems: Sequence[Problem]
    setting: EvalSetting
    source: str = ""


@dataclass
class BenchmarkOutcome:
    name: str
    metrics: dict
    generated: int  # problems generated in this run
    resumed: int  # problems taken from samples.jsonl
    seconds: float


@dataclass
class EvalReport:
    results: dict  # what results.json holds
    outcomes: list[BenchmarkOutcome]  # this run's benchmarks, in order
    output_dir: Path


def _model_identity(model_info: dict) -> dict:
    return {"spec": model_info.get("spec"), "checkpoint": model_info.get("checkpoint")}


def _write_json_atomic(path: Path, data: dict) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def _lock_output_dir(output_dir: Path):
    """Hold an exclusive lock on ``output_dir`` for the whole evaluation: two evaluations appending to one
    ``samples.jsonl`` would interleave their lines. The lock goes with the process, so a killed run leaves none."""
    import fcntl

    output_dir.mkdir(parents=True, exist_ok=True)
    handle = open(output_dir / ".lock", "a+")  # noqa: SIM115 - closed by the caller's ExitStack
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        owner = handle.read().strip() or "unknown"
        handle.close()
        raise EvalError(
            f"another tepo eval (pid {owner}) is writing to {output_dir}; wait for it or use another --output-dir"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


def _prepare_output_dir(
    output_dir: Path, model_info: dict, tasks: Sequence[BenchmarkTask], overwrite: bool
) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    settings_path = output_dir / SETTINGS_FILE
    if overwrite:
        for name in (SAMPLES_FILE, RESULTS_FILE, SETTINGS_FILE, FAILURES_FILE):
            (output_dir / name).unlink(missing_ok=True)
    saved = {"model": _model_identity(model_info), "benchmarks": {}}
    if settings_path.exists():
        try:
            saved = json.loads(settings_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            saved = None
        if not isinstance(saved, dict) or not isinstance(saved.get("benchmarks"), dict):
            raise EvalError(
                f"{settings_path}: unreadable; pass --overwrite to start this directory again"
            ) from None
        if saved.get("model") != _model_identity(model_info):
            raise EvalError(
                f"{output_dir} holds an evaluation of model {saved.get('model')}, not "
                f"{_model_identity(model_info)}; use another --output-dir or pass --overwrite"
            )
    elif (output_dir / SAMPLES_FILE).exists():
        raise EvalError(
            f"{output_dir / SAMPLES_FILE} exists without {SETTINGS_FILE}, so its settings are unknown; "
            "use another --output-dir or pass --overwrite"
        )
    for task in tasks:
        new = task.setting.as_dict()
        old = saved["benchmarks"].get(task.name)
        if old is not None and old != new:
            diff = ", ".join(
                f"{k}: {old.get(k)!r} -> {new.get(k)!r}"
                for k in sorted(set(old) | set(new))
                if old.get(k) != new.get(k)
            )
            raise EvalError(
                f"{output_dir} already holds {task.name} samples with other settings ({diff}); "
                "use another --output-dir, the same settings, or --overwrite"
            )
        saved["benchmarks"][task.name] = new
    _write_json_atomic(settings_path, saved)


def _finished(records: list[dict], task: BenchmarkTask, samples_path: Path) -> dict[int, dict]:
    done: dict[int, dict] = {}
    for record in records:
        if record["benchmark"] != task.name:
            continue
        index = record["index"]
        if not isinstance(index, int) or index < 0:
            raise EvalError(f"{samples_path}: {task.name} record has a bad index {index!r}")
        if index >= len(task.problems) or index in done:
            continue  # beyond this run's --limit (kept in the file), or a duplicate line
        expected = task.problems[index].id
        if record["id"] != expected:
            raise EvalError(
                f"{samples_path}: {task.name} problem {index} was recorded with id {record['id']!r} but the data "
                f"now has {expected!r} there (the benchmark file changed); use another --output-dir or --overwrite"
            )
        if len(record["responses"]) != task.setting.num_samples:
            raise EvalError(
                f"{samples_path}: {task.name} problem {index} has {len(record['responses'])} responses, expected "
                f"{task.setting.num_samples}"
            )
        done[index] = record
    return done


def _progress_bar(task: BenchmarkTask, initial: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(
        total=len(task.problems),
        initial=initial,
        desc=f"{task.name} ({task.setting.label})",
        unit="problem",
        file=sys.stderr,
        disable=not enabled,
        dynamic_ncols=True,
        smoothing=0.1,
    )


def _reward_failures(output_dir: Path, log: Callable[[str], None]):
    """The record of the user's reward functions' failures in an evaluation: a warning, the output folder's
    failures file, and a stop (exit 2) on a batch where a function failed on every response."""
    from tepo.rewards import RewardFailures

    return RewardFailures(
        output_dir / FAILURES_FILE,
        log=log,
        resume_hint="once it is fixed, run the command again with --overwrite (samples.jsonl holds the "
        "responses it failed on, with the reason)",
        defer_stop=True,
    )


def evaluate_benchmarks(
    backend,
    tokenizer,
    tasks: Sequence[BenchmarkTask],
    output_dir: str | os.PathLike,
    *,
    model_info: dict,
    pool=None,
    batch_size: int | None = 8,
    pass_k: Sequence[int] = DEFAULT_PASS_K,
    reward_workers: int = 2,
    reward_timeout_s: float = 10.0,
    overwrite: bool = False,
    progress: bool = True,
    protocol: str | None = None,
    log: Callable[[str], None] = print,
    reward_functions: Sequence = (),
) -> EvalReport:
    """Evaluate every task, resuming from ``output_dir/samples.jsonl``; ``EvalReport.results`` is ``results.json``.

    ``backend`` is a rollout backend (``HFRollout``); ``pool`` a ``RewardPool`` (one with
    ``reward_workers`` workers and ``reward_timeout_s`` per item is started, and closed, when None).
    ``reward_functions``: the user's own (``tepo.rewards.UserRewardFunction``), scored beside math-verify's
    accuracy into each benchmark's ``rewards`` (a given ``pool`` must have loaded them).
    """
    from tepo.rewards import RewardPool

    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise EvalError(f"batch size must be an integer >= 1 (or None: the engine's), got {batch_size!r}")
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise EvalError(f"each benchmark may appear once, got {names}")
    output_dir = Path(output_dir)
    with ExitStack() as stack:  # the lock, the pool and the progress bars
        stack.enter_context(_lock_output_dir(output_dir))
        _prepare_output_dir(output_dir, model_info, tasks, overwrite)
        samples_path = output_dir / SAMPLES_FILE
        records = read_samples(samples_path, warn=log)

        results_path = output_dir / RESULTS_FILE
        results = _earlier_results(results_path, model_info, protocol, log)

        outcomes = []

        def start_pool():  # the first time a benchmark has problems left to score
            return stack.enter_context(
                RewardPool(
                    num_workers=reward_workers,
                    timeout_s=reward_timeout_s,
                    functions=[f.for_pool() for f in reward_functions],
                    log_dir=output_dir,  # what the workers and the user's functions print
                    failures=_reward_failures(output_dir, log),
                )
            )

        for task in tasks:
            outcome, pool = _run_task(
                task,
                backend,
                tokenizer,
                start_pool if pool is None else pool,
                stack,
                records,
                samples_path,
                results,
                results_path,
                batch_size=batch_size,
                pass_k=pass_k,
                progress=progress,
                reward_functions=reward_functions,
            )
            outcomes.append(outcome)
        return EvalReport(results=results, outcomes=outcomes, output_dir=output_dir)


def _run_task(
    task,
    backend,
    tokenizer,
    pool,
    stack,
    records,
    samples_path,
    results,
    results_path,
    *,
    batch_size,
    pass_k,
    progress,
    reward_functions,
) -> tuple[BenchmarkOutcome, object]:
    """One benchmark: its unfinished problems scored batch by batch (each appended to samples.jsonl as it
    finishes), its metrics into ``results`` and results.json. ``pool``: the reward pool, or a function that
    starts one (called only when problems are left); returns the outcome and the pool (or that function)."""
    done = _finished(records, task, samples_path)
    todo = [i for i in range(len(task.problems)) if i not in done]
    start = time.perf_counter()
    if todo and callable(pool):
        pool = pool()
    bar = stack.enter_context(_progress_bar(task, len(done), progress))
    correct = [r["num_correct"] / r["num_samples"] for r in done.values()]
    # None: as many prompts as keep the engine at its throughput (all its rows busy), 8 for HF generate.
    samples_per_prompt = 1 if task.setting.greedy else task.setting.num_samples
    task_batch = batch_size or engine_batch_prompts(backend, samples_per_prompt, default=8)
    batches: dict[int, list[int]] = {}
    for i in todo:
        batches.setdefault(i // task_batch, []).append(i)
    for batch_index, indices in batches.items():
        scored = _score_batch(
            backend, tokenizer, task, indices, batch_index, pool, task_batch, reward_functions
        )
        new = [problem_record(task.name, i, result) for i, result in zip(indices, scored, strict=True)]
        append_samples(samples_path, new)
        if getattr(pool, "failures", None) is not None:
            pool.failures.raise_if_stopped()  # after the batch's records, its failures' reasons among them
        for i, record in zip(indices, new):
            done[i] = record
            correct.append(record["num_correct"] / record["num_samples"])
        bar.set_postfix(acc=f"{sum(correct) / len(correct):.3f}", refresh=False)
        bar.update(len(new))
    bar.close()
    ordered = [done[i] for i in range(len(task.problems))]
    metrics = benchmark_metrics(ordered, greedy=task.setting.greedy, pass_k=pass_k)
    results["benchmarks"][task.name] = {
        **metrics,
        "source": task.source,
        "settings": task.setting.as_dict(),
    }
    results["created"] = datetime.now(UTC).isoformat(timespec="seconds")
    _write_json_atomic(results_path, results)
    seconds = time.perf_counter() - start
    return BenchmarkOutcome(task.name, metrics, len(todo), len(task.problems) - len(todo), seconds), pool


def _earlier_results(results_path: Path, model_info: dict, protocol: str | None, log) -> dict:
    """``results.json`` as far as an earlier run of this folder wrote it (its benchmarks), for this model."""
    results = {"model": model_info, "benchmarks": {}}
    if results_path.exists():
        try:
            results["benchmarks"] = dict(json.loads(results_path.read_text(encoding="utf-8"))["benchmarks"])
        except (json.JSONDecodeError, KeyError, TypeError):
            log(f"{results_path}: unreadable, rewriting it from {SAMPLES_FILE}")
    results["protocol"] = protocol
    return results


def _score_batch(backend, tokenizer, task, indices, batch_index, pool, task_batch, reward_functions):
    """One batch of ``task``'s problems scored by its setting (``tepo.evaluate.core.score_problems``)."""
    s = task.setting
    try:
        return score_problems(
            backend,
            tokenizer,
            [task.problems[i] for i in indices],
            pool,
            instruction=s.instruction,
            num_samples=s.num_samples,
            greedy=s.greedy,
            max_new_tokens=s.max_new_tokens,
            temperature=s.temperature if not s.greedy else 1.0,
            top_p=s.top_p,
            seed=s.seed + batch_index,
            batch_prompts=task_batch,
            answer_format=s.answer_format,
            reward_functions=[f.label for f in reward_functions],
        )
    except RolloutError as err:
        # Finished batches are in samples.jsonl already: the same command resumes after them.
        raise err.add_context(
            f"{task.name} problems {indices[0] + 1}-{indices[-1] + 1} of {len(task.problems)}"
        ) from None


def results_table(results: dict, names: Sequence[str] | None = None) -> str:
    """The terminal table: one row per benchmark, the headline accuracy (greedy or avg@n), pass@k columns and
    cons@n (majority vote over all n samples; "-" for greedy settings), and the mean of each reward function
    of the user's own (``--reward-function``)."""
    from tepo.metrics.tables import format_table

    benches = results["benchmarks"]
    names = [n for n in (names or list(benches)) if n in benches]
    ks = sorted({int(k) for n in names for k in benches[n].get("pass@k", {})})
    labels = sorted({label for n in names for label in benches[n].get("rewards", {})})
    headers = [
        "benchmark",
        "setting",
        "problems",
        "accuracy",
        *(f"pass@{k}" for k in ks),
        "cons@n",
        "boxed",
        "mean tokens",
        "truncated",
        *labels,
    ]
    rows = []
    for name in names:
        m = benches[name]
        settings = m.get("settings", {})
        label = (
            "greedy"
            if settings.get("greedy", True)
            else f"avg@{m.get('samples_per_problem')} T={settings['temperature']:g}"
        )
        passk = m.get("pass@k", {})
        rows.append(
            [
                name,
                label,
                m.get("num_problems"),
                _pct(m.get("accuracy")),
                *(_pct(passk.get(str(k))) for k in ks),
                _pct(m.get("cons@k", {}).get(str(m.get("samples_per_problem")))),
                _pct(m.get("boxed_rate")),
                _num(m.get("mean_response_tokens")),
                _pct(m.get("truncated_rate")),
                *(_mean(m.get("rewards", {}).get(label)) for label in labels),
            ]
        )
    return format_table(headers, rows)


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _mean(reward: dict | None) -> str:
    return "-" if reward is None else f"{reward['mean']:.3f}"


def _num(value) -> str:
    return "-" if value is None else f"{value:.1f}"
