"""Generation at the default run's shapes: every engine candidate of issue #54 on one benchmark, in one run.

    .venv/bin/python benchmarks/bench_generation.py                    # all candidates, 2 rounds
    .venv/bin/python benchmarks/bench_generation.py --candidates today,compiled --rounds 1

Each candidate is vLLM's CPU engine as tepo's server builds it (``tepo.rollout.vllm_server``: in-process engine,
no chunked prefill, ``processed_logprobs``, bf16 where ``auto`` picks it, 0.25 GiB KV cache), started in a fresh
process of the vLLM interpreter (``.venv-vllm``), with one setting changed:

- ``today``: the engine as it was when issue #54 was filed (eager, vLLM's CPU block size of 128), with the
  default's requests: 4 prompts x 8 seeded samples, the sampled tokens' log-probs;
- ``no_logprobs``: no log-probs returned (the sampler's log-softmax over the vocabulary is then skipped);
- ``unseeded``: no per-request generator (one engine-wide one);
- ``compiled``: ``enforce_eager=False``, vLLM's inductor-compiled CPU graph, from an empty compile cache (start-up
  includes the whole compile);
- ``compiled_warm``: the same from a compile cache that an untimed compiled start filled at the beginning of this
  run (what every engine start after a machine's first pays; see ``tepo.rollout.vllm_launch.compile_env``);
- ``rows64``: 8 prompts x 8 samples, twice the default's rows in one batch;
- ``block32``: KV-cache blocks of 32 tokens instead of the CPU platform's 128 (32 is the smallest its attention
  kernel takes: 16 fails with "No common block size"). vLLM's prefix cache shares only whole blocks, so at 128 the
  8 samples of a 50-60-token prompt share nothing and the prefill runs all 32 rows whole; at 32 each prompt's
  first 32 tokens are computed once for its 8 samples (tepo's engine default since, ``CPU_BLOCK_SIZE`` in
  ``tepo.rollout.vllm_launch``);
- ``block32_compiled_warm``: both, the compiled engine from the warm cache with 32-token blocks.

Every response is exactly ``--new-tokens`` long (``min_tokens``), so each candidate does the same work. Measured:
start-up seconds; the prefill's milliseconds (a 1-token generate); the decode step's milliseconds from the
difference of a long and a short generate (the prefill and the per-call costs cancel); tokens per second over the
long generate. The prefix cache is emptied before every timed call, as a weight sync empties it before every
training step's generate, so no call reuses an earlier call's prompts. The **floor** beside them:
the milliseconds of the model's matmuls alone for one decode step at 32 rows (the layer projections and the
vocabulary head, bf16, through the same oneDNN kernels, weights prepacked as the engine holds them), measured in
the same run. Ratios are against ``today``; the load average is printed with every line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

CANDIDATES = (
    "today",
    "no_logprobs",
    "unseeded",
    "compiled",
    "compiled_warm",
    "rows64",
    "block32",
    "block32_compiled_warm",
)
QUESTIONS = [
    f"What is {a} + {b} * 3? Give the final answer as a number."
    for a, b in ((37, 48), (123, 456), (19, 7), (88, 91), (5, 64), (71, 12), (240, 3), (9, 99))
]


def engine_worker(args) -> dict:
    """Run in the vLLM interpreter: one candidate's engine, timed."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from vllm import LLM, SamplingParams

    prompts = json.loads(args.prompts)
    name, tokens = args.candidate, args.new_tokens
    start = time.perf_counter()
    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        max_model_len=4096,
        seed=0,
        enforce_eager="compiled" not in name,
        skip_tokenizer_init=True,
        logprobs_mode="processed_logprobs",
        kv_cache_memory_bytes=int(0.25 * 2**30),
        enable_chunked_prefill=False,
        max_num_batched_tokens=4096,
        **({"block_size": 32} if "block32" in name else {}),
    )
    startup = time.perf_counter() - start
    batch = prompts[: 8 if name == "rows64" else 4]

    def generate(length: int) -> tuple[float, int]:
        params = [
            SamplingParams(
                n=8,
                max_tokens=length,
                min_tokens=length,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                seed=None if name == "unseeded" else i,
                logprobs=None if name == "no_logprobs" else 0,
                detokenize=False,
            )
            for i in range(len(batch))
        ]
        llm.reset_prefix_cache()  # as after a weight sync: this call's prompts are new to the engine
        t = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
        return time.perf_counter() - t, sum(len(c.token_ids) for o in out for c in o.outputs)

    generate(8)  # warm-up
    prefill, _ = generate(1)
    short, _ = generate(8)
    long, produced = generate(tokens + 8)
    return {
        "startup_s": startup,
        "prefill_ms": 1000 * prefill,
        "decode_ms": 1000 * (long - short) / tokens,
        "tokens_per_s": produced / long,
        "rows": 8 * len(batch),
    }


def floor_worker(args) -> dict:
    """Run in the vLLM interpreter: the matmuls of one decode step at 32 rows, weights prepacked as the engine's."""
    import torch
    from vllm import _custom_ops as ops

    from_config = json.loads(Path(args.model, "config.json").read_text())
    hidden, inter = from_config["hidden_size"], from_config["intermediate_size"]
    heads, kv_heads = from_config["num_attention_heads"], from_config["num_key_value_heads"]
    head_dim = hidden // heads
    shapes = [
        (hidden, (heads + 2 * kv_heads) * head_dim),  # qkv
        (hidden, hidden),  # o
        (hidden, 2 * inter),  # gate_up
        (inter, hidden),  # down
    ] * from_config["num_hidden_layers"] + [(hidden, from_config["vocab_size"])]
    weights = [torch.randn(n, k, dtype=torch.bfloat16) for k, n in shapes]
    handlers = [ops.create_onednn_mm(w.t(), 32) for w in weights]
    inputs = {k: torch.randn(32, k, dtype=torch.bfloat16) for k, _ in shapes}

    def step() -> None:
        for (k, _), handler in zip(shapes, handlers):
            ops.onednn_mm(handler, inputs[k], None)

    step()
    times = []
    for _ in range(5):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return {"floor_ms": 1000 * statistics.median(times)}


def prompt_ids(model: str) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    return [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
        )
        for q in QUESTIONS
    ]


def run_in_vllm(python: str, argv: list[str], cores: str, cache: str | None = None) -> dict:
    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND=cores)
    env.pop("PYTHONPATH", None)
    if cache is not None:  # the compiled candidates: tepo's compile settings, with the cache in `cache`
        from tepo.rollout.vllm_launch import compile_env

        env.update(compile_env(cache))
    proc = subprocess.run([python, __file__, *argv], capture_output=True, text=True, env=env, timeout=1800)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"worker {argv[:2]} failed:\n{proc.stderr[-3000:]}")
    return json.loads(line[7:])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--candidates", default=",".join(CANDIDATES))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument(
        "--cores", default=None, help="cores for the engine's threads (default: all of this process's)"
    )
    parser.add_argument("--candidate", help=argparse.SUPPRESS)  # worker modes
    parser.add_argument("--floor", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default=None, help=argparse.SUPPRESS)  # chosen by main() (tepo.precision)
    parser.add_argument("--prompts", help=argparse.SUPPRESS)
    return parser


def worker_arguments(new_tokens: int) -> tuple[list[str], str]:
    """The arguments every worker gets (model, dtype, prompts, tokens), and the engine's dtype."""
    from tepo.models import resolve_model_path
    from tepo.precision import native_bf16

    model = resolve_model_path(None)
    dtype = "bfloat16" if native_bf16("cpu").native else "float32"
    common = ["--model", model, "--dtype", dtype, "--prompts", json.dumps(prompt_ids(model))]
    return [*common, "--new-tokens", str(new_tokens)], dtype


def run_candidates(python: str, names: list[str], common: list[str], cores: str, rounds: int):
    """Each candidate once per round in a fresh engine process (the order reversed every other round), and the
    matmul floor once per round; returns {candidate: [result per round]} and the floors."""
    results: dict[str, list[dict]] = {n: [] for n in names}
    floors = []
    caches = tempfile.TemporaryDirectory(prefix="bench-generation-cache-")
    warm_cache = os.path.join(caches.name, "warm")
    # Fill the warm cache, untimed (per engine configuration: vLLM keys its compile cache by the engine's settings).
    for name in [n for n in names if n.endswith("compiled_warm")]:
        run_in_vllm(python, ["--candidate", name, *common, "--new-tokens", "8"], cores, warm_cache)
    for round_index in range(rounds):
        floors.append(run_in_vllm(python, ["--floor", *common], cores)["floor_ms"])
        for name in names if round_index % 2 == 0 else names[::-1]:
            cache = {
                "compiled": os.path.join(caches.name, f"cold{round_index}"),
                "compiled_warm": warm_cache,
                "block32_compiled_warm": warm_cache,
            }
            result = run_in_vllm(python, ["--candidate", name, *common], cores, cache.get(name))
            results[name].append(result)
            shown = json.dumps({k: round(v, 1) for k, v in result.items()})
            print(f"round {round_index + 1} {name:>12}: {shown} load {os.getloadavg()[0]:.2f}", flush=True)
    return results, floors


def print_table(results: dict[str, list[dict]], floors: list[float]) -> None:
    """Medians per candidate, against ``today`` (or the first candidate when today was not run) and the floor."""
    names = list(results)
    floor = statistics.median(floors)
    base_runs = results.get("today", results[names[0]])
    base = statistics.median(r["decode_ms"] for r in base_runs)
    base_rate = statistics.median(r["tokens_per_s"] for r in base_runs)
    print(f"\nfloor: {floor:.1f} ms of matmuls per decode step at 32 rows (oneDNN, prepacked bf16 weights)")
    print(
        "| candidate | rows | start-up s | prefill ms | decode ms/step | tokens/s | tokens/s vs today "
        "| decode vs today | ms/step per 32 rows / floor |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        per32 = med["decode_ms"] * 32 / med["rows"]
        print(
            f"| {name} | {med['rows']:.0f} | {med['startup_s']:.1f} | {med['prefill_ms']:.0f} "
            f"| {med['decode_ms']:.1f} | {med['tokens_per_s']:.0f} | {med['tokens_per_s'] / base_rate:.2f}x "
            f"| {base / med['decode_ms']:.2f}x | {per32 / floor:.2f} |"
        )


def main(argv=None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.floor or args.candidate:
        print("RESULT " + json.dumps(floor_worker(args) if args.floor else engine_worker(args)), flush=True)
        return

    from tepo.rollout.vllm_launch import find_vllm_python

    names = [c.strip() for c in args.candidates.split(",") if c.strip()]
    unknown = set(names) - set(CANDIDATES)
    if unknown:
        parser.error(f"unknown candidates {sorted(unknown)}; choose from {list(CANDIDATES)}")
    python = find_vllm_python()
    common, dtype = worker_arguments(args.new_tokens)
    cores = args.cores or ",".join(map(str, sorted(os.sched_getaffinity(0))))
    load = os.getloadavg()[0]
    print(
        f"engine dtype {dtype}, cores {cores}, {args.new_tokens} tokens per response, load {load:.2f}",
        flush=True,
    )
    results, floors = run_candidates(python, names, common, cores, args.rounds)
    print_table(results, floors)


if __name__ == "__main__":
    main()
