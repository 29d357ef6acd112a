"""A weight sync's cost on the CPU: the weights file kept and overwritten in place (now) against a new file at
every sync (before), side by side in one process (issue #54; docs/performance.md, "The weight-sync file, kept").

Two measurements, each alternating the two ways ``--rounds`` times (A, B, A, B, ...) so that the machine's load
hits both alike; medians and their ratio are printed:

1. the write alone (``WeightsFile.write``) of the embedded model (SmolLM2-135M-Instruct) in ``--dtype`` (``auto``:
   the engine's, bf16 where the CPU computes it natively), to /dev/shm (or the folder ``choose_weights_root``
   picks);
2. the full sync (the write plus the vLLM engine's ``reload_weights``) with a real engine, when vLLM is installed
   (skipped with ``--write-only``).

"A new file" is what tepo did before: the file deleted after the engine loaded it, and written anew (fresh pages
allocated) at the next sync. With ``--threads`` both the trainer and the engine use that many cores.

    .venv/bin/python benchmarks/bench_weight_sync.py --rounds 8
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import bind_engine_cores, fmt, median, ratio, set_threads

from tepo.models import embedded_model_dir, load_model_and_tokenizer
from tepo.rollout.vllm_launch import engine_dtype
from tepo.rollout.weight_sync import WeightsFile, choose_weights_root, weights_bytes


def write_new_file(weights: WeightsFile, model) -> float:
    """The way before: no file kept between syncs, so every write creates and fills a new one."""
    weights.delete()
    start = time.perf_counter()
    weights.write(model)
    return time.perf_counter() - start


def write_in_place(weights: WeightsFile, model) -> float:
    start = time.perf_counter()
    weights.write(model)
    return time.perf_counter() - start


def alternate(rounds: int, before, now) -> tuple[list[float], list[float]]:
    """Seconds of ``before()`` and ``now()``, called alternately ``rounds`` times each (after one of each unmeasured)."""
    before(), now()
    times_before, times_now = [], []
    for _ in range(rounds):
        times_before.append(before())
        times_now.append(now())
    return times_before, times_now


def report(what: str, times_before: list[float], times_now: list[float]) -> None:
    b, n = median(times_before), median(times_now)
    print(f"{what}: new file {fmt(b, 3)} s, kept file {fmt(n, 3)} s (medians of {len(times_now)}), "
          f"kept / new = {fmt(ratio(n, b))}")  # fmt: skip


def measure_write(model, dtype: torch.dtype, rounds: int) -> None:
    root, note = choose_weights_root(weights_bytes(model, dtype))
    print(note or f"weights file in {root}: {weights_bytes(model, dtype) / 2**20:.0f} MiB")
    folder = Path(tempfile.mkdtemp(dir=root))
    try:
        weights = WeightsFile(folder, dtype)
        report(
            "write",
            *alternate(
                rounds, lambda: write_new_file(weights, model), lambda: write_in_place(weights, model)
            ),
        )
        weights.release()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def measure_full_sync(model, tokenizer, dtype: torch.dtype, rounds: int, threads: int) -> None:
    from tepo.rollout.vllm import VLLMRollout

    bind_engine_cores(threads)
    with VLLMRollout(model, tokenizer, dtype=str(dtype).removeprefix("torch.")) as engine:
        weights = engine._weights.file

        def sync(fresh: bool) -> float:
            if fresh:
                weights.delete()
            engine.sync_weights(force=True)
            return engine.last_sync_seconds

        report(
            "full sync (write + engine reload)", *alternate(rounds, lambda: sync(True), lambda: sync(False))
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument(
        "--dtype", choices=("auto", "bfloat16", "float32"), default="auto", help="auto: the engine's (tepo.precision)"
    )
    parser.add_argument("--threads", type=int, default=len(__import__("os").sched_getaffinity(0)))
    parser.add_argument("--write-only", action="store_true", help="skip the full sync with a vLLM engine")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    model, tokenizer = load_model_and_tokenizer(str(embedded_model_dir()))
    dtype = getattr(torch, engine_dtype(args.dtype, model))
    print(f"threads {args.threads}, dtype {str(dtype).removeprefix('torch.')}, {args.rounds} rounds")
    measure_write(model, dtype, args.rounds)
    if not args.write_only:
        measure_full_sync(model, tokenizer, dtype, args.rounds, args.threads)


if __name__ == "__main__":
    main()
