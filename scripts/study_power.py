"""Per method of a `tepo compare` table: the paired differences against the reference on one measure (held-out
greedy accuracy by default), their mean with the table's 95% Student-t interval, their spread over seeds, and the
smallest difference the study detects now and with more seeds, and on how many seeds the method was higher, equal
and lower (tepo.compare.power: a paired t-test at two-sided
5% with 80% power, the spread measured on the differences at hand), as a Markdown table.

    python scripts/study_power.py docs/results/tepo-claims --seeds 6
    python scripts/study_power.py docs/results/tepo-claims --measure pass@8 --measure entropy_kept
    python scripts/study_power.py PILOT_DIR --target 0.10      # plan: seeds for a 0.10 difference at 80% power

Reads the directory's table.json (`tepo compare --table-only` writes it), so it sees exactly the pairs the table
made: a seed counts only where the table paired the method with the reference (its ``held_out_delta``; runs of
another precision or machine are not paired there, and are not here). ``--measure``: any per-seed value of
table.json (``held_out``, ``sampled``, ``pass@k``, ``entropy_kept``, ``auc_held_out``, ...); a seed where either
run lacks it (pass@k of runs made before eval.pass_k_samples) is left out.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path


def paired_differences(table: dict, method_row: dict, measure: str) -> list[float]:
    """``method - reference`` on ``measure``, one value per seed the table paired."""
    reference = next(r for r in table["rows"] if r["method"] == table["convergence"]["reference"])
    out = []
    for seed, values in method_row["per_seed"].items():
        if "held_out_delta" not in values:
            continue
        if measure == "held_out":
            out.append(values["held_out_delta"])
            continue
        ref = reference["per_seed"].get(seed, {})
        if values.get(measure) is not None and ref.get(measure) is not None:
            out.append(values[measure] - ref[measure])
    return out


def direction_counts(deltas: list[float], tolerance: float = 1e-9) -> tuple[int, int, int]:
    """How many paired differences are above, at and below 0: the direction of each seed, which one collapsed
    run cannot move the way it moves a mean (a difference within ``tolerance`` counts as equal)."""
    return (
        sum(d > tolerance for d in deltas),
        sum(abs(d) <= tolerance for d in deltas),
        sum(d < -tolerance for d in deltas),
    )


def power_rows(table: dict, seeds: list[int], measure: str = "held_out") -> list[dict]:
    from tepo.compare.power import paired_power_row
    from tepo.compare.stats import t_interval

    rows = []
    for row in table["rows"]:
        deltas = paired_differences(table, row, measure) if row["per_seed"] else []
        if deltas:
            interval = t_interval(deltas)
            rows.append(
                {
                    "method": row["method"],
                    "interval": (interval.low, interval.high),
                    "signs": direction_counts(deltas),
                    **paired_power_row(deltas, seeds=seeds),
                }
            )
    return rows


def markdown(rows: list[dict], reference: str, seeds: list[int], measure: str = "held_out") -> str:
    counts = sorted({k for r in rows for k in r["detectable"]} | set(seeds))
    head = [
        "method",
        "paired seeds",
        "seeds higher / equal / lower",
        f"mean Δ {measure} vs {reference} [95% t]",
        "sd of Δ",
        *(f"detectable at {k} seeds" for k in counts),
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        sd = "-" if r["sd"] is None else f"{r['sd']:.3f}"
        low, high = r["interval"]
        cells = [f"{r['detectable'][k]:.3f}" if k in r["detectable"] else "-" for k in counts]
        mean = f"{r['mean']:+.3f}" + ("" if low is None else f" [{low:+.3f}, {high:+.3f}]")
        signs = " / ".join(map(str, r["signs"]))
        lines.append(f"| {r['method']} | {r['n']} | {signs} | {mean} | {sd} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plan_markdown(table: dict, measure: str, target: float, power: float, max_seeds: int) -> str:
    """Per method: the seeds a study needs to detect ``target`` (tepo.compare.power.plan_seeds), from the paired
    spread the pilot measured; the Holm level counts every method the table compares with the reference."""
    from tepo.compare.power import plan_seeds

    reference = table["convergence"]["reference"]
    compared = [r for r in table["rows"] if r["method"] != reference]
    head = [
        "method",
        "pilot seeds",
        "sd of Δ",
        "seeds (sign-flip, simulated)",
        "seeds (t, exact)",
        "power at plan",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in compared:
        deltas = paired_differences(table, row, measure)
        if len(deltas) < 2:
            lines.append(f"| {row['method']} | {len(deltas)} | - | - | - | - |")
            continue
        sd = statistics.stdev(deltas)
        plan = plan_seeds(sd, target, comparisons=len(compared), power=power, max_seeds=max_seeds)
        flip, t = plan["seeds_sign_flip"], plan["seeds_t"]
        at = plan["curve"].get(flip, {}).get("sign_flip") if flip else None
        lines.append(
            f"| {row['method']} | {len(deltas)} | {sd:.3f} | {flip or f'> {max_seeds}'} | {t or f'> {max_seeds}'} | "
            f"{'-' if at is None else f'{at:.2f}'} |"
        )
    level = 0.05 / max(len(compared), 1)
    return (
        "\n".join(lines)
        + f"\n\ntarget: {measure} difference {target:+.3f} vs {reference} at {power:.0%} power, two-sided level "
        f"0.05 / {len(compared)} = {level:.4f} (Holm's bound for the smallest p); normal differences with the "
        "pilot's sd, 2,000 simulated studies per seed count\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--seeds", type=int, action="append", default=[], help="also at this many seeds")
    parser.add_argument(
        "--measure", action="append", default=[], help="a per-seed value of table.json (default held_out)"
    )
    parser.add_argument(
        "--target",
        type=float,
        help="plan: the seeds that detect this paired difference with 80%% power (sign-flip test simulated, "
        "t-test exact) at the Holm level 0.05 / (methods compared), from each method's measured spread",
    )
    parser.add_argument("--power", type=float, default=0.8, help="power the plan asks for (default 0.8)")
    parser.add_argument(
        "--max-seeds", type=int, default=40, help="largest seed count a plan tries (default 40)"
    )
    args = parser.parse_args(argv)
    from tepo.compare.render import read_table_or_say_why

    table = read_table_or_say_why(args.directory)
    if table is None:
        return 2
    reference = table["convergence"]["reference"]
    if args.target is not None:
        measure = (args.measure or ["held_out"])[0]
        sys.stdout.write(plan_markdown(table, measure, args.target, args.power, args.max_seeds))
        return 0
    for i, measure in enumerate(args.measure or ["held_out"]):
        if i:
            print()
        sys.stdout.write(markdown(power_rows(table, args.seeds, measure), reference, args.seeds, measure))
    print(
        f"\npaired by seed with {reference}; interval: Student t, n - 1 df (tepo.compare.stats); "
        "detectable: (t_0.975 + t_0.8, n-1 df) x sd / sqrt(n)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
