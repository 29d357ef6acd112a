"""What issue #23's two engine fixes cost or save, side by side in one script: vLLM's CPU build with chunked prefill
on (vLLM's default) against off (tepo's, so that no seeded request is prefilled in part), and held-out evaluation
in 16-prompt calls (before) against whole-set calls (now).

    .venv/bin/python benchmarks/bench_vllm_batching.py --data-dir ../shared/data
    .venv/bin/python benchmarks/bench_vllm_batching.py --data-dir ../shared/data --rounds 1 --prompts 8

1. Chunked prefill: the same *unseeded* batch (GSM8K prompts x 8 samples, 128 new tokens; unseeded because a
   seeded one crashes with chunked prefill on, which is the bug) through two engines, alternating A, B, A, B...;
   generated tokens / generation seconds for each, and the ratio off / on.
2. Evaluation batching: greedy held-out evaluation of ``--eval-problems`` GSM8K test problems at 128 tokens
   (``tepo.evaluate.score_problems``, the code `tepo train`'s evaluation runs) in calls of 16 prompts against one
   call for all of them, on the default engine; seconds and the ratio.
The machine is shared and noisy: the load average is printed with every number, and only ratios of runs done
back to back mean much.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import load_average, median

INSTRUCTION = "Give the final answer as a number."


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-dir", help="directory with gsm8k/ (default: $TEPO_DATA_DIR)")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--eval-problems", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2)
    return parser


def load_inputs(args, tokenizer):
    """GSM8K prompts: one warm-up set and a fresh set per round (no prefix-cache hits across rounds), and the
    held-out problems for the evaluation part."""
    from tepo.data import build_prompt_ids, load_problems

    data = Path(args.data_dir or os.environ.get("TEPO_DATA_DIR") or "") / "gsm8k"
    if not (data / "train.jsonl").is_file():
        raise SystemExit(f"no GSM8K rows in {data}: pass --data-dir (or set $TEPO_DATA_DIR)")
    train = load_problems(str(data / "train.jsonl"))[: args.prompts * (args.rounds + 1)]
    prompts = build_prompt_ids(tokenizer, train[: args.prompts], INSTRUCTION)
    rounds = [
        build_prompt_ids(tokenizer, train[(r + 1) * args.prompts : (r + 2) * args.prompts], INSTRUCTION)
        for r in range(args.rounds)
    ]
    problems = load_problems(str(data / "test.jsonl"))[: args.eval_problems]
    return prompts, rounds, problems


def measure_chunked_prefill(model, tokenizer, prompts, rounds, args) -> dict[str, list[float]]:
    """Generation tokens/s of two engines, chunked prefill on and off, on the same fresh prompts each round."""
    from tepo.rollout.vllm import VLLMRollout

    rates: dict[str, list[float]] = {"on": [], "off": []}
    engines = {mode: VLLMRollout(model, tokenizer, chunked_prefill=mode) for mode in ("on", "off")}
    try:
        for mode, engine in engines.items():  # one unmeasured call each: caches, first-call costs
            engine.generate(prompts[:2], num_samples=2, max_new_tokens=8)
            print(f"chunked prefill {mode}: engine limits {engine.engine_limits}", flush=True)
        for r, batch_prompts in enumerate(rounds):
            for mode, engine in engines.items():
                batch = engine.generate(batch_prompts, num_samples=args.samples, max_new_tokens=args.new_tokens)
                rate = batch.num_generated_tokens / batch.gen_seconds
                rates[mode].append(rate)
                print(
                    f"round {r}: chunked prefill {mode:>3s}: {batch.num_generated_tokens} tokens in "
                    f"{batch.gen_seconds:.1f} s = {rate:.0f} tokens/s (load {load_average()[0]:.1f})",
                    flush=True,
                )
    finally:
        for engine in engines.values():
            engine.close()
    return rates


def measure_evaluation_calls(model, tokenizer, prompts, problems, args) -> dict[int, list[float]]:
    """Seconds of a greedy held-out evaluation sent in calls of 16 problems against one call for all."""
    from tepo.evaluate import score_problems
    from tepo.rewards import RewardPool
    from tepo.rollout.vllm import VLLMRollout

    seconds: dict[int, list[float]] = {16: [], len(problems): []}
    with (
        VLLMRollout(model, tokenizer) as engine,
        RewardPool(num_workers=2, timeout_s=10.0) as pool,
    ):
        engine.generate(prompts[:2], num_samples=1, max_new_tokens=8, greedy=True)
        for r in range(args.rounds):
            for calls_of in seconds:
                start = time.perf_counter()
                score_problems(
                    engine, tokenizer, problems, pool, instruction=INSTRUCTION, greedy=True,
                    max_new_tokens=args.new_tokens, batch_prompts=calls_of,
                )  # fmt: skip
                seconds[calls_of].append(time.perf_counter() - start)
                print(
                    f"round {r}: evaluation of {len(problems)} problems in calls of {calls_of}: "
                    f"{seconds[calls_of][-1]:.1f} s (load {load_average()[0]:.1f})",
                    flush=True,
                )
    return seconds


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)

    from tepo.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(None)
    prompts, rounds, problems = load_inputs(args, tokenizer)
    print(
        f"{len(prompts)} prompts x {args.samples} samples, {sum(map(len, prompts))} prompt tokens, "
        f"{args.new_tokens} new tokens; load {load_average()}",
        flush=True,
    )
    rates = measure_chunked_prefill(model, tokenizer, prompts, rounds, args)
    seconds = measure_evaluation_calls(model, tokenizer, prompts, problems, args)
    on, off = median(rates["on"]), median(rates["off"])
    small, whole = median(seconds[16]), median(seconds[len(problems)])
    print()
    print("| measurement | A | B | B / A |")
    print("|---|---|---|---|")
    print(f"| generation tokens/s: chunked prefill on (A) vs off (B) | {on:.0f} | {off:.0f} | {off / on:.2f} |")
    print(
        f"| held-out evaluation seconds, {len(problems)} problems: calls of 16 (A) vs one call (B) "
        f"| {small:.1f} | {whole:.1f} | {whole / small:.2f} |"
    )
    print(f"load average at end: {load_average()}")


if __name__ == "__main__":
    main()
