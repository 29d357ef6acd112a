"""Per method of a `tepo compare` table: the paired held-out differences against the reference, their spread
over seeds, and the smallest difference the study detects now and with more seeds (tepo.compare.power: a paired
t-test at two-sided 5% with 80% power, the spread measured on the differences at hand), as a Markdown table.

    python scripts/study_power.py docs/results/tepo-claims --seeds 6

Reads the directory's table.json (`tepo compare --table-only` writes it), so it sees exactly the pairs the table
made (runs of another precision or machine are not paired there, and are not here).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def power_rows(table: dict, seeds: list[int]) -> list[dict]:
    from tepo.compare.power import paired_power_row

    rows = []
    for row in table["rows"]:
        deltas = [v["held_out_delta"] for v in row["per_seed"].values() if "held_out_delta" in v]
        if deltas:
            rows.append({"method": row["method"], **paired_power_row(deltas, seeds=seeds)})
    return rows


def markdown(rows: list[dict], reference: str, seeds: list[int]) -> str:
    counts = sorted({k for r in rows for k in r["detectable"]} | set(seeds))
    head = [
        "method",
        "paired seeds",
        f"mean Δ vs {reference}",
        "sd of Δ",
        *(f"detectable at {k} seeds" for k in counts),
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        sd = "-" if r["sd"] is None else f"{r['sd']:.3f}"
        cells = [f"{r['detectable'][k]:.3f}" if k in r["detectable"] else "-" for k in counts]
        lines.append(f"| {r['method']} | {r['n']} | {r['mean']:+.3f} | {sd} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--seeds", type=int, action="append", default=[], help="also at this many seeds")
    args = parser.parse_args(argv)
    path = args.directory / "table.json"
    if not path.exists():
        print(
            f"{path}: not found; run `tepo compare --table-only --dir {args.directory}` first",
            file=sys.stderr,
        )
        return 2
    table = json.loads(path.read_text())
    reference = table["convergence"]["reference"]
    sys.stdout.write(markdown(power_rows(table, args.seeds), reference, args.seeds))
    print(
        f"\nheld-out greedy accuracy, paired by seed with {reference}; detectable: (t_0.975 + t_0.8, n-1 df) x sd / sqrt(n)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
