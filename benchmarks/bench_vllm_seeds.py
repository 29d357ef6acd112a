"""Per-request seeds on the vLLM CPU build (issue #35, item 3; docs/performance.md, "The CUDA path").

64 prompts x 8 samples x up to 128 new tokens: every prompt's request seeded (tepo's scheme,
``vllm_server._sampling_params``) against unseeded requests, vLLM's batched sampler path (in vLLM 0.32 the only
"one seed per call" is the engine's seed at start-up). Embedded model SmolLM2-135M-Instruct, float32 engine,
chunked prefill off for both (the CPU's "auto"). Alternating runs, so drift in a shared machine's load hits both.

    .venv/bin/python benchmarks/bench_vllm_seeds.py [seeded|unseeded ...]
    TEPO_BENCH_PROMPTS=16 TEPO_BENCH_TOKENS=32 .venv/bin/python benchmarks/bench_vllm_seeds.py   # smaller
"""

from __future__ import annotations

import os
import sys
import time

import torch

from tepo.models import embedded_model_dir, load_model_and_tokenizer
from tepo.rollout.vllm import VLLMRollout


def main(order: list[str]) -> None:
    torch.set_num_threads(1)
    model, tok = load_model_and_tokenizer(str(embedded_model_dir()))
    prompts = [
        list(
            tok.apply_chat_template(
                [{"role": "user", "content": f"What is {i} + {2 * i + 3}? Think step by step."}],
                add_generation_prompt=True,
            )["input_ids"]
        )
        for i in range(int(os.environ.get("TEPO_BENCH_PROMPTS", 64)))
    ]
    with VLLMRollout(model, tok, dtype="float32") as engine:
        engine.generate(prompts[:4], num_samples=2, max_new_tokens=16, seed=1)  # warm-up
        for mode in order:
            seed = 123 if mode == "seeded" else None
            start = time.perf_counter()
            batch = engine.generate(
                prompts,
                num_samples=8,
                max_new_tokens=int(os.environ.get("TEPO_BENCH_TOKENS", 128)),
                temperature=1.0,
                seed=seed,
                return_logprobs=True,
            )
            wall = time.perf_counter() - start
            tokens = batch.num_generated_tokens
            print(f"{mode}: {tokens} tokens in {wall:.1f} s -> {tokens / wall:.0f} tokens/s", flush=True)
        a = engine.generate(prompts[:8], num_samples=8, max_new_tokens=32, seed=7)
        b = engine.generate(prompts[:8], num_samples=8, max_new_tokens=32, seed=7)
        print("seeded: the same call twice gives the same samples:", torch.equal(a.input_ids, b.input_ids))


if __name__ == "__main__":
    main(sys.argv[1:] or ["seeded", "unseeded", "seeded", "unseeded"])
