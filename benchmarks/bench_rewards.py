"""Throughput of ``RewardPool``: items/s with 1 vs 2 workers, with and without one hostile item per batch.

    .venv/bin/python benchmarks/bench_rewards.py [--batches 5] [--batch-size 256] [--timeout 5]

A batch looks like one GRPO step: ``batch-size`` completions, 8 samples per prompt, about 1.5 kB of reasoning
each, a mix of boxed answers, bare final numbers, wrong answers and LaTeX fractions. The "hostile" variant
replaces one completion per batch with ``\\boxed{9^{9^{9^{9}}}}``, which math-verify cannot finish: it costs one
worker one timeout (``0.8 * timeout`` soft deadline in the worker), so it bounds a step's reward time from below.
Prints the median over ``--batches`` batches.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from tepo.rewards import RewardPool

HOSTILE = "Therefore the answer is \\boxed{9^{9^{9^{9}}}}."


def make_batch(batch_size: int, seed: int) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    responses, answers = [], []
    for i in range(batch_size):
        if i % 8 == 0:
            a, b = rng.randint(2, 99), rng.randint(2, 99)
            gold_num, gold_den = a, b
        reasoning = f"We need to combine {gold_num} and {gold_den}. " * 30
        kind = rng.randrange(4)
        if kind == 0:
            tail = f"So the result is \\boxed{{\\frac{{{gold_num}}}{{{gold_den}}}}}."
        elif kind == 1:
            tail = f"The answer is {gold_num}/{gold_den}."
        elif kind == 2:
            tail = f"So the result is \\boxed{{{gold_num + 1}}}."
        else:
            tail = f"Thus $x = \\boxed{{\\dfrac{{{2 * gold_num}}}{{{2 * gold_den}}}}}$."
        responses.append(reasoning + tail)
        answers.append(f"\\frac{{{gold_num}}}{{{gold_den}}}")
    return responses, answers


def measure(num_workers: int, hostile: bool, args) -> tuple[float, float]:
    t0 = time.perf_counter()
    with RewardPool(num_workers=num_workers, timeout_s=args.timeout) as pool:
        startup = time.perf_counter() - t0
        rates = []
        for b in range(args.batches):
            responses, answers = make_batch(args.batch_size, seed=b)
            if hostile:
                responses[len(responses) // 2] = HOSTILE
            t = time.perf_counter()
            results = pool.score(responses, answers)
            rates.append(len(results) / (time.perf_counter() - t))
            if hostile:
                assert results[len(results) // 2].status == "timeout"
    return statistics.median(rates), startup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--timeout", type=float, default=5.0)
    args = parser.parse_args()
    rows = {}
    for workers in (1, 2):
        for hostile in (False, True):
            rows[workers, hostile] = measure(workers, hostile, args)
    print(f"batch size {args.batch_size}, timeout {args.timeout} s, median of {args.batches} batches")
    print(
        f"{'workers':>7} | {'clean items/s':>13} | {'+1 hostile items/s':>18} | {'hostile/clean':>13} | start-up s"
    )
    for workers in (1, 2):
        clean, startup = rows[workers, False]
        dirty, _ = rows[workers, True]
        print(f"{workers:>7} | {clean:>13.1f} | {dirty:>18.1f} | {dirty / clean:>13.3f} | {startup:.2f}")
    print(
        f"2 vs 1 workers: clean x{rows[2, False][0] / rows[1, False][0]:.2f}, "
        f"hostile x{rows[2, True][0] / rows[1, True][0]:.2f}"
    )


if __name__ == "__main__":
    main()
