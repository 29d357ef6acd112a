"""The token-level methods of a `tepo compare` directory beside the reference at the same seeds, as a Markdown
table: final held-out (and its paired difference), sampled accuracy, pass@1/pass@8, entropy kept, and what each
method did with the groups whose rewards were all equal (the groups GRPO-style advantages give nothing).

    python scripts/token_level_table.py docs/results/tepo-claims --methods grpo,tepo,ep_grpo,erpo,entropy_adv --seeds 3,4,5

"all-equal groups per step": the mean of ``reward/frac_groups_all_equal`` over the run's steps; "their tokens
advantaged": the mean of ``reward/frac_all_equal_tokens_advantaged`` over steps 2 onward that had such groups
(at step 1 the policy is the reference model, where EP-GRPO's fallback is 0 by construction); "steps with no
gradient": steps whose ``update/grad_norm`` was exactly 0. With several seeds, each method's rows end with their
mean (each column over the seeds that have it). Reads the directory's table.json and the runs' metrics.jsonl
(finished runs only).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

# The table's numeric columns after method and seed, with the digits each is printed with.
COLUMNS = (
    ("held_out", ".3f"),
    ("held_out_delta", "+.3f"),
    ("sampled", ".3f"),
    ("pass@1", ".3f"),
    ("pass@8", ".3f"),
    ("entropy_kept", ".3f"),
    ("all_equal_groups", ".2f"),
    ("all_equal_tokens_advantaged", ".2f"),
    ("steps_without_gradient", "d"),
)


def run_numbers(directory: Path, table_rows: dict, method: str, seed: int) -> dict | None:
    """One finished run's values by column (None where it has none), from table.json and its metrics.jsonl."""
    from tepo.metrics import read_metrics

    run = directory / method / f"seed{seed}"
    if not (run / "summary.json").exists() or method not in table_rows:
        return None
    values = table_rows[method]["per_seed"][str(seed)]
    steps = read_metrics(run / "metrics.jsonl")
    equal = [row.get("reward/frac_groups_all_equal") or 0.0 for row in steps]
    advantaged = [
        row.get("reward/frac_all_equal_tokens_advantaged") or 0.0
        for row, share in zip(steps, equal)
        if share and row["step"] >= 2
    ]
    return {key: values.get(key) for key, _ in COLUMNS[:6]} | {
        "all_equal_groups": statistics.fmean(equal),
        "all_equal_tokens_advantaged": statistics.fmean(advantaged) if advantaged else None,
        "steps_without_gradient": sum(row.get("update/grad_norm") == 0 for row in steps),
    }


def mean_numbers(runs: list[dict]) -> dict:
    """Each column's mean over the runs that have it (a count column's mean printed with one decimal)."""
    out = {}
    for key, _ in COLUMNS:
        present = [run[key] for run in runs if run[key] is not None]
        out[key] = statistics.fmean(present) if present else None
    return out


def markdown_row(method: str, label: str, numbers: dict) -> str:
    cells = [f"`{method}`", label]
    for key, digits in COLUMNS:
        value = numbers[key]
        if value is None:
            cells.append("-")
        elif digits == "d":  # a count, or its mean over seeds (a whole mean printed as a count)
            cells.append(str(int(value)) if float(value).is_integer() else f"{value:.1f}")
        else:
            cells.append(f"{value:{digits}}")
    return "| " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--methods", required=True, help="comma-separated, the reference first")
    parser.add_argument("--seeds", default="3", help="comma-separated seeds")
    args = parser.parse_args(argv)
    from tepo.compare.render import read_table_or_say_why

    table = read_table_or_say_why(args.directory)
    if table is None:
        return 2
    table_rows = {row["method"]: row for row in table["rows"]}
    head = [
        "method", "seed", "held-out", "Δ held-out vs reference", "sampled", "pass@1", "pass@8", "entropy kept",
        "all-equal groups per step", "their tokens advantaged (steps 2-)", "steps with no gradient",
    ]  # fmt: skip
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    seeds = [int(s) for s in args.seeds.split(",")]
    for method in args.methods.split(","):
        runs = [(seed, run_numbers(args.directory, table_rows, method, seed)) for seed in seeds]
        runs = [(seed, numbers) for seed, numbers in runs if numbers is not None]
        for seed, numbers in runs:
            print(markdown_row(method, str(seed), numbers))
        if len(runs) > 1:
            print(markdown_row(method, f"**mean of {len(runs)}**", mean_numbers([n for _, n in runs])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
