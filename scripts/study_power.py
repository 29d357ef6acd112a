"""Per method of a `tepo compare` table: the paired differences against the reference on one measure (held-out
greedy accuracy by default), their mean with the table's 95% bootstrap interval, their spread over seeds, and the
smallest difference the study detects now and with more seeds, and on how many seeds the method was higher, equal
and lower (tepo.compare.power: a paired t-test at two-sided
5% with 80% power, the spread measured on the differences at hand), as a Markdown table.

    python scripts/study_power.py docs/results/tepo-claims --seeds 6
    python scripts/study_power.py docs/results/tepo-claims --measure pass@8 --measure entropy_kept

Reads the directory's table.json (`tepo compare --table-only` writes it), so it sees exactly the pairs the table
made: a seed counts only where the table paired the method with the reference (its ``held_out_delta``; runs of
another precision or machine are not paired there, and are not here). ``--measure``: any per-seed value of
table.json (``held_out``, ``sampled``, ``pass@k``, ``entropy_kept``, ``auc_held_out``, ...); a seed where either
run lacks it (pass@k of runs made before eval.pass_k_samples) is left out.
"""

from __future__ import annotations

import argparse
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
    from tepo.compare.stats import bootstrap_interval

    rows = []
    for row in table["rows"]:
        deltas = paired_differences(table, row, measure) if row["per_seed"] else []
        if deltas:
            interval = bootstrap_interval(deltas)
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
        f"mean Δ {measure} vs {reference} [95% bootstrap]",
        "sd of Δ",
        *(f"detectable at {k} seeds" for k in counts),
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        sd = "-" if r["sd"] is None else f"{r['sd']:.3f}"
        low, high = r["interval"]
        cells = [f"{r['detectable'][k]:.3f}" if k in r["detectable"] else "-" for k in counts]
        mean = f"{r['mean']:+.3f} [{low:+.3f}, {high:+.3f}]"
        signs = " / ".join(map(str, r["signs"]))
        lines.append(f"| {r['method']} | {r['n']} | {signs} | {mean} | {sd} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--seeds", type=int, action="append", default=[], help="also at this many seeds")
    parser.add_argument(
        "--measure", action="append", default=[], help="a per-seed value of table.json (default held_out)"
    )
    args = parser.parse_args(argv)
    from tepo.compare.render import read_table_or_say_why

    table = read_table_or_say_why(args.directory)
    if table is None:
        return 2
    reference = table["convergence"]["reference"]
    for i, measure in enumerate(args.measure or ["held_out"]):
        if i:
            print()
        sys.stdout.write(markdown(power_rows(table, args.seeds, measure), reference, args.seeds, measure))
    print(
        f"\npaired by seed with {reference}; interval: the percentile bootstrap of the mean (tepo.compare.stats); "
        "detectable: (t_0.975 + t_0.8, n-1 df) x sd / sqrt(n)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
