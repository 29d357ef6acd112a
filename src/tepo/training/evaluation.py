"""Held-out evaluation during training: greedy accuracy and (``eval.samples`` > 0) sampled accuracy, with
(``eval.samples`` > 1) ``eval/sampled_cons``: cons@n, the majority vote over the ``n = eval.samples`` answers of
each problem (equivalent answers by math-verify, a tie of ``t`` answers scores ``1/t``; `tepo.passk.cons_at_k`).

On a named benchmark (``eval.source=math500``...) the held-out problems are judged by that benchmark's protocol,
as ``tepo eval`` judges them (its instruction asking for a boxed answer, ``boxed`` answer extraction), so the
numbers of a run and of ``tepo eval`` on the same model and token budget agree. On the training task's own
held-out split the training prompt format and answer format are used.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tepo.config import RunConfig
from tepo.data import Problem
from tepo.evaluate import accuracy, score_problems
from tepo.evaluate.benchmarks import benchmark_names
from tepo.evaluate.core import engine_batch_prompts
from tepo.evaluate.records import problem_records, write_problem_records
from tepo.evaluate.settings import BENCHMARK_INSTRUCTION, DEFAULT_ANSWER_FORMAT
from tepo.passk import mean_cons_at_k, mean_pass_at_k

# Each pass's accuracy by its logged name (one name a pass, spelled out for tepo.metrics.catalogue).
_ACCURACY = {"greedy": "eval/greedy_accuracy", "sampled": "eval/sampled_accuracy"}


def held_out_protocol(config: RunConfig) -> dict:
    """The prompt instruction and answer format the held-out problems are judged with (see the module doc)."""
    if config.eval.source in benchmark_names():
        return {"instruction": BENCHMARK_INSTRUCTION, "answer_format": DEFAULT_ANSWER_FORMAT}
    return {
        "instruction": config.data.instruction,
        "answer_format": None,
    }  # None: the reward pool's own format


def pass_k_values(n: int) -> list[int]:
    """The k of ``eval.pass_k_samples = n``: 1, 2, 4, ... up to n (n itself included when it is no power of 2)."""
    ks = [2**i for i in range(n.bit_length()) if 2**i <= n]
    return ks + ([n] if n and ks[-1] != n else [])


def evaluate_held_out(
    rollout,
    tokenizer,
    problems: Sequence[Problem],
    pool,
    config: RunConfig,
    *,
    pass_k: bool = False,
    records_path: Path | None = None,
) -> dict:
    """``eval/greedy_accuracy``, ``eval/sampled_accuracy`` (``eval/sampled_cons``) and ``time/eval_seconds`` on
    ``problems``, with a bar, named as a metrics row logs them; with ``pass_k`` and ``eval.pass_k_samples = n > 0``
    also ``eval/pass@k`` for :func:`pass_k_values` (n) (the initial and the trained policy's evaluations ask for
    it; the files of a run directory hold these under their own keys: ``tepo.training.summary``).
    ``records_path``: where each problem's outcome is written (``tepo.evaluate.records``)."""
    from tqdm.auto import tqdm

    e, r = config.eval, config.rollout
    if not problems:
        return {}
    common = dict(
        **held_out_protocol(config),
        max_new_tokens=e.max_new_tokens or r.max_new_tokens,
        seed=10_000 + config.train.seed,
    )
    passes = [("greedy", {"greedy": True})]
    if e.samples:
        passes.append(("sampled", {"num_samples": e.samples, "temperature": e.temperature, "top_p": r.top_p}))
    if pass_k and e.pass_k_samples:
        # Seeded apart from the sampled pass (20_000 + seed), so turning pass@k on changes no other number.
        sampling = {"num_samples": e.pass_k_samples, "temperature": e.temperature, "top_p": r.top_p}
        passes.append(("pass_k", sampling | {"seed": 20_000 + config.train.seed}))
    out, by_pass = {}, {}
    start = time.perf_counter()
    with tqdm(
        total=len(problems) * len(passes),
        desc="eval",
        unit="problem",
        disable=not config.log.progress,
        file=sys.stderr,
        dynamic_ncols=True,
        leave=False,
    ) as bar:
        for name, kwargs in passes:
            results = score_problems(
                rollout,
                tokenizer,
                problems,
                pool,
                **(common | kwargs),
                # vLLM gets the whole held-out set in one call (16 prompts a call left it mostly idle); HF generate
                # keeps 16-prompt batches; eval.batch_prompts fixes it (to reproduce earlier studies' numbers).
                batch_prompts=e.batch_prompts
                or engine_batch_prompts(rollout, kwargs.get("num_samples", 1), default=16),
                on_batch=lambda chunk: bar.update(len(chunk)),
            )
            by_pass[name] = results
            if name == "pass_k":
                correct = [sum(v.status == "correct" for v in r.verdicts) for r in results]
                for k in pass_k_values(e.pass_k_samples):
                    out[f"eval/pass@{k}"] = mean_pass_at_k(e.pass_k_samples, correct, k)
                continue
            out[_ACCURACY[name]] = accuracy(results)
            if name == "sampled" and e.samples > 1:
                # cons@n: majority vote over the eval.samples answers (all of them: one subset), tie 1/t.
                out["eval/sampled_cons"] = mean_cons_at_k(
                    [(r.votes, [v.status == "correct" for v in r.verdicts]) for r in results], e.samples
                )
    out["time/eval_seconds"] = time.perf_counter() - start
    if records_path is not None:
        write_problem_records(records_path, problem_records(problems, by_pass))
    return out
