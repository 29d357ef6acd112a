"""How a tepo training step's time, throughput and memory grow with prompts per step and response length, on
GSM8K prompts, with TRL 1.16's GRPOTrainer beside it at one shape: a table and a plot.

    .venv/bin/python benchmarks/bench_scaling.py --data-dir ../shared/data               # the sweep (resumable)
    .venv/bin/python benchmarks/bench_scaling.py --data-dir ../shared/data --quick       # 2 small shapes, smoke
    .venv/bin/python benchmarks/bench_scaling.py --results scaling.jsonl --report-only   # table + plot again

Two sweeps that cross at the (16 prompts, 256 tokens) point, 8 samples per prompt throughout:
prompts per step 4, 16, 64 at 256 new tokens, and 64, 256, 1024 new tokens at 16 prompts. Each shape runs in a
fresh subprocess (the tepo worker of ``bench_vs_trl.py``: the `tepo` preset on today's defaults, i.e. the vLLM
engine where installed, one update per rollout, the precision ``auto`` picks on this machine for both tepo and
TRL (bf16 autocast where the hardware computes bf16 natively, float32 elsewhere), micro-batches of 16 sequences),
so its peak memory is its own. TRL runs the (16, 256) shape in the same script (``--trl-shapes``). Every finished
shape is appended to ``--results`` (JSONL) at once, and a rerun skips the shapes already there: a killed sweep
goes on where it stopped.

Reported per shape (medians over the measured steps): step, generation and update seconds; generation tokens/s
(tokens actually generated / generation seconds: an instruction model often stops before the limit, so the
generated tokens are printed too) and update tokens/s (response tokens through the log-prob pass, loss and
backward / update seconds); peak resident memory of the trainer process and peak PSS of every process of the run
(trainer, vLLM server, reward workers). Times are wall-clock on a shared machine: the load average at each
shape's start is in the table, and ratios between shapes in one run mean more than any absolute number.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import fmt, load_average, machine_precision, median, precision_line, run_worker

WORKER = str(Path(__file__).resolve().parent / "bench_vs_trl.py")
SAMPLES = 8
PROMPT_SWEEP = (4, 16, 64)  # at 256 new tokens
LENGTH_SWEEP = (64, 256, 1024)  # at 16 prompts
QUICK_SHAPES = [(2, 4, 32), (4, 4, 64)]
COLORS = {"step": "C0", "generation": "C1", "update": "C2"}  # one colour per phase in every panel


def sweep_shapes() -> list[tuple[int, int, int]]:
    """(prompts, samples, new tokens): both sweeps, the shared point once, cheapest first (a sweep cut short by the
    session's end still has the small shapes)."""
    shapes = [(p, SAMPLES, 256) for p in PROMPT_SWEEP]
    shapes += [(16, SAMPLES, t) for t in LENGTH_SWEEP if (16, SAMPLES, t) not in shapes]
    return sorted(shapes, key=lambda s: s[0] * s[1] * s[2])


def _key(side: str, shape) -> str:
    return f"{side}:{shape[0]}x{shape[1]}:{shape[2]}"


def read_results(path: Path) -> dict[str, dict]:
    """Finished shapes of an earlier run of the sweep, by side and shape (a torn last line is ignored)."""
    done = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            done[_key(entry["side"], (entry["prompts"], entry["samples"], entry["new_tokens"]))] = entry
    return done


def measure(side: str, shape, *, data: str, warmup: int, steps: int, threads: int, machine: dict) -> dict:
    prompts, samples, new_tokens = shape
    workload = {
        "prompts": prompts,
        "samples": samples,
        "new_tokens": new_tokens,
        "warmup": warmup,
        "steps": steps,
        "data": data,
        "bf16": machine["bf16"],
    }
    load = load_average()[0]
    result = run_worker(
        [WORKER, "--worker", side, "--workload", json.dumps(workload), "--threads", str(threads)]
    )
    if "error" in result:
        raise SystemExit(f"{side} at {prompts}x{samples}, {new_tokens} tokens failed: {result['error']}")
    rows = result["measured_rows"]

    def per_s(tokens: str, seconds: str) -> float:
        return median(r[tokens] / r[seconds] for r in rows if r[seconds] > 0)

    return {
        "side": side,
        "prompts": prompts,
        "samples": samples,
        "new_tokens": new_tokens,
        "steps": len(rows),
        "step_seconds": median(r["step_seconds"] for r in rows),
        "gen_seconds": median(r["gen_seconds"] for r in rows),
        "update_seconds": median(r["update_seconds"] for r in rows),
        "gen_tokens": median(r["gen_tokens"] for r in rows),
        "update_tokens": median(r["update_tokens"] for r in rows),
        "gen_tokens_per_s": per_s("gen_tokens", "gen_seconds"),
        "update_tokens_per_s": per_s("update_tokens", "update_seconds"),
        "peak_rss_mb": result["peak_rss_mb"],
        "peak_tree_pss_mb": result.get("peak_tree_pss_mb", float("nan")),
        "load_avg": load,
        "threads": threads,
        "cpu_model": machine["cpu_model"],
        "cpu_flags": machine["cpu_flags"],
        "precision": machine["precision"],
    }


def table(entries: list[dict]) -> str:
    lines = [
        "| side | prompts x samples | max new tokens | generated tokens | step s | generation s | update s "
        "| gen tokens/s | update tokens/s | peak RSS MiB (trainer) | peak PSS MiB (all processes) | load avg "
        "| precision |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        lines.append(
            f"| {e['side']} | {e['prompts']}x{e['samples']} | {e['new_tokens']} | {e['gen_tokens']:.0f} "
            f"| {fmt(e['step_seconds'], 1)} | {fmt(e['gen_seconds'], 1)} | {fmt(e['update_seconds'], 1)} "
            f"| {e['gen_tokens_per_s']:.0f} | {e['update_tokens_per_s']:.0f} "
            f"| {e['peak_rss_mb']:.0f} | {e['peak_tree_pss_mb']:.0f} | {e['load_avg']:.1f} "
            # Entries written before 2026-12-05 ran bf16 autocast on a Zen 4 (avx512_bf16) and did not record it.
            f"| {e.get('precision', 'bf16')} |"
        )
    return "\n".join(lines)


def trl_ratios(entries: list[dict], ours: str) -> list[str]:
    """tepo / TRL at every shape both ran (below 1: tepo is faster or smaller)."""
    by = {(e["side"], e["prompts"], e["samples"], e["new_tokens"]): e for e in entries}
    out = []
    for (side, p, s, t), trl in by.items():
        mine = by.get((ours, p, s, t))
        if side != "trl" or mine is None:
            continue
        parts = [
            f"{name} {mine[key] / trl[key]:.2f}x"
            for name, key in (
                ("step", "step_seconds"),
                ("generation", "gen_seconds"),
                ("update", "update_seconds"),
                ("peak PSS", "peak_tree_pss_mb"),
            )
            if trl[key]
        ]
        out.append(f"{ours} / TRL at {p}x{s}, {t} tokens: " + ", ".join(parts))
    return out


def plot(entries: list[dict], ours: str, path: Path) -> Path:
    """Step time and throughput against prompts (left) and response length (right), log-log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mine = [e for e in entries if e["side"] == ours and e["samples"] == SAMPLES]
    sweeps = [
        (
            "prompts per step (x8 samples, 256 new tokens)",
            "prompts",
            [e for e in mine if e["new_tokens"] == 256],
        ),
        ("max new tokens (16 prompts x 8 samples)", "new_tokens", [e for e in mine if e["prompts"] == 16]),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex="col")
    for col, (label, key, points) in enumerate(sweeps):
        points = sorted(points, key=lambda e: e[key])
        xs = [e[key] for e in points]
        top, bottom = axes[0][col], axes[1][col]
        for name, field in (
            ("step", "step_seconds"),
            ("generation", "gen_seconds"),
            ("update", "update_seconds"),
        ):
            top.plot(xs, [e[field] for e in points], marker="o", label=name, color=COLORS[name])
        if len(xs) > 1:  # what linear growth from the smallest point would be
            top.plot(xs, [points[0]["step_seconds"] * x / xs[0] for x in xs], "k:", label="linear from first")
        for name, field in (("generation", "gen_tokens_per_s"), ("update", "update_tokens_per_s")):
            bottom.plot(xs, [e[field] for e in points], marker="o", label=name, color=COLORS[name])
        for trl in (e for e in entries if e["side"] == "trl"):
            if (key == "prompts" and trl["new_tokens"] == 256) or (
                key == "new_tokens" and trl["prompts"] == 16
            ):
                top.plot([trl[key]], [trl["step_seconds"]], "rx", markersize=10, label="TRL 1.16 step")
        top.set_ylabel("seconds per step")
        bottom.set_ylabel("tokens / s")
        bottom.set_xlabel(label)
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle(f"tepo ({ours}) on GSM8K prompts: cost against batch and response length")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-dir", help="directory with gsm8k/train.jsonl (default: $TEPO_DATA_DIR)")
    parser.add_argument(
        "--quick", action="store_true", help="two small shapes, 1 measured step (a smoke run)"
    )
    parser.add_argument("--steps", type=int, default=1, help="measured steps per shape")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured steps first (weight sync, caches)")
    parser.add_argument(
        "--threads", type=int, default=2, help="torch threads of the trainer (and engine cores)"
    )
    parser.add_argument("--variant", default="ours", help="a tepo variant of bench_vs_trl.py")
    parser.add_argument(
        "--trl-shapes", default="16x8:256", help="shapes TRL runs too, e.g. 16x8:256,4x8:256 ('' for none)"
    )
    parser.add_argument("--results", default="scaling.jsonl", help="one line per finished shape (resumable)")
    parser.add_argument("--plot", default="scaling.png")
    parser.add_argument("--report-only", action="store_true", help="print the table and plot from --results")
    args = parser.parse_args(argv)

    import os

    results_path = Path(args.results)
    if not args.report_only:
        data_dir = Path(args.data_dir or os.environ.get("TEPO_DATA_DIR") or "")
        data = data_dir / "gsm8k" / "train.jsonl"
        if not data.is_file():
            raise SystemExit(f"no GSM8K training rows at {data}: pass --data-dir (or set $TEPO_DATA_DIR)")
        shapes = QUICK_SHAPES if args.quick else sweep_shapes()
        trl = set() if args.quick else {s for s in args.trl_shapes.split(",") if s}
        plan = []
        for shape in shapes:  # TRL right after tepo at its shapes: the two are measured under the same load
            plan.append((args.variant, shape))
            if f"{shape[0]}x{shape[1]}:{shape[2]}" in trl:
                plan.append(("trl", shape))
        done = read_results(results_path)
        machine = machine_precision("cpu")
        print(precision_line(machine), flush=True)
        print(
            f"load average at start: {load_average()}; threads {args.threads}; {len(plan)} runs", flush=True
        )
        for side, shape in plan:
            if _key(side, shape) in done:
                print(f"{_key(side, shape)}: already in {results_path}", flush=True)
                continue
            entry = measure(
                side,
                shape,
                data=str(data),
                warmup=args.warmup,
                steps=args.steps,
                threads=args.threads,
                machine=machine,
            )
            with results_path.open("a") as f:
                f.write(json.dumps(entry) + "\n")
            print(
                f"{_key(side, shape)}: step {fmt(entry['step_seconds'], 1)} s, generation "
                f"{entry['gen_tokens_per_s']:.0f} tok/s, update {entry['update_tokens_per_s']:.0f} tok/s, "
                f"peak PSS {entry['peak_tree_pss_mb']:.0f} MiB (load {entry['load_avg']:.1f})",
                flush=True,
            )
        print(f"\nload average at end: {load_average()}\n")
    entries = list(read_results(results_path).values())
    entries.sort(key=lambda e: (e["side"] == "trl", e["new_tokens"] != 256, e["prompts"], e["new_tokens"]))
    print(table(entries))
    for line in trl_ratios(entries, args.variant):
        print(line)
    print(f"\nplot: {plot(entries, args.variant, Path(args.plot))}")


if __name__ == "__main__":
    main()
