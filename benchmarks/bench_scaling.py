"""How a tepo training step's time and peak memory grow with the batch (prompts x samples) and response length.

    .venv/bin/python benchmarks/bench_scaling.py --quick          # 5 shapes, 1 warm-up + 1 measured step each
    .venv/bin/python benchmarks/bench_scaling.py --steps 3 --with-trl --json scaling.json

Two sweeps around the issue-8 workload (4 prompts x 8 samples, 64 new tokens): batch 2x4, 4x8, 8x8 at 64 tokens,
and 32, 64, 128 new tokens at 4x8. Each shape runs in a fresh subprocess (the tepo worker of
``bench_vs_trl.py``: same config, one update per rollout, bf16 autocast for the update, ``--threads`` torch
threads), so its peak resident memory is its own. ``--variant`` picks a ``bench_vs_trl`` variant (e.g.
``ours_untuned``); ``--with-trl`` runs TRL's ``GRPOTrainer`` on every shape too (slow: about 2x tepo's time).

Sampling is at temperature 1 from an instruction model: responses often stop before the token limit, so the
tokens actually generated per step are printed next to each shape.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import fmt, load_average, median, run_worker

WORKER = str(Path(__file__).resolve().parent / "bench_vs_trl.py")
BATCH_SWEEP = [(2, 4), (4, 8), (8, 8)]
LENGTH_SWEEP = [32, 64, 128]


def shapes() -> list[tuple[int, int, int]]:
    out = [(p, s, 64) for p, s in BATCH_SWEEP]
    out += [(4, 8, t) for t in LENGTH_SWEEP if (4, 8, t) not in out]
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="1 measured step per shape")
    parser.add_argument(
        "--steps", type=int, default=None, help="measured steps per shape (default 2; quick 1)"
    )
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--variant", default="ours", help="a tepo variant of bench_vs_trl.py")
    parser.add_argument("--with-trl", action="store_true", help="also run TRL on every shape")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    steps = args.steps or (1 if args.quick else 2)
    sides = [args.variant] + (["trl"] if args.with_trl else [])

    print(f"load average at start: {load_average()}; threads {args.threads}; sides {sides}", flush=True)
    results = []
    for prompts, samples, new_tokens in shapes():
        workload = {
            "prompts": prompts,
            "samples": samples,
            "new_tokens": new_tokens,
            "warmup": args.warmup,
            "steps": steps,
        }
        for side in sides:
            load = load_average()[0]
            result = run_worker(
                [WORKER, "--worker", side, "--workload", json.dumps(workload), "--threads", str(args.threads)]
            )
            if "error" in result:
                print(result["error"], file=sys.stderr)
                sys.exit(1)
            rows = result["measured_rows"]
            entry = {
                "side": side,
                "prompts": prompts,
                "samples": samples,
                "new_tokens": new_tokens,
                "step_seconds": median(r["step_seconds"] for r in rows),
                "gen_seconds": median(r["gen_seconds"] for r in rows),
                "update_seconds": median(r["update_seconds"] for r in rows),
                "gen_tokens": median(r["gen_tokens"] for r in rows),
                "peak_rss_mb": result["peak_rss_mb"],
                "peak_tree_pss_mb": result.get("peak_tree_pss_mb", float("nan")),
                "load_avg": load,
            }
            results.append(entry)
            print(
                f"{side:>18s} {prompts}x{samples:<3d} {new_tokens:4d} tok: step {fmt(entry['step_seconds'], 1)} s,"
                f" peak {entry['peak_rss_mb']:.0f} MiB (load {load:.2f})",
                flush=True,
            )

    print(f"\nload average at end: {load_average()}\n")
    print(
        "| side | prompts x samples | max new tokens | generated tokens/step | step s | generation s | update s "
        "| peak RSS MiB (trainer) | peak PSS MiB (all processes) | load avg |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for e in results:
        print(
            f"| {e['side']} | {e['prompts']}x{e['samples']} | {e['new_tokens']} | {e['gen_tokens']:.0f} "
            f"| {fmt(e['step_seconds'], 1)} | {fmt(e['gen_seconds'], 1)} | {fmt(e['update_seconds'], 1)} "
            f"| {e['peak_rss_mb']:.0f} | {e['peak_tree_pss_mb']:.0f} | {e['load_avg']:.1f} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"threads": args.threads, "results": results}, indent=2))


if __name__ == "__main__":
    main()
