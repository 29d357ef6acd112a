"""The token-level methods of a `tepo compare` directory beside the reference at the same seeds, as a Markdown
table: final held-out (and its paired difference), sampled accuracy, pass@1/pass@8, entropy kept, and what each
method did with the groups whose rewards were all equal (the groups GRPO-style advantages give nothing).

    python scripts/token_level_table.py docs/results/tepo-claims --methods grpo,tepo,ep_grpo,erpo,entropy_adv --seeds 3

"all-equal groups per step": the mean of ``reward/frac_groups_all_equal`` over the run's steps; "their tokens
advantaged": the mean of ``reward/frac_all_equal_tokens_advantaged`` over steps 2 onward that had such groups
(at step 1 the policy is the reference model, where EP-GRPO's fallback is 0 by construction); "steps with no
gradient": steps whose ``update/grad_norm`` was exactly 0. Reads the directory's table.json and the runs'
metrics.jsonl (finished runs only).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path


def run_row(directory: Path, table_rows: dict, method: str, seed: int) -> str | None:
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
    delta = values.get("held_out_delta")
    cells = [
        f"`{method}`",
        str(seed),
        f"{values['held_out']:.3f}",
        "-" if delta is None else f"{delta:+.3f}",
        f"{values['sampled']:.3f}",
        *(f"{values[k]:.3f}" if k in values else "-" for k in ("pass@1", "pass@8")),
        f"{values['entropy_kept']:.3f}",
        f"{statistics.fmean(equal):.2f}",
        f"{statistics.fmean(advantaged):.2f}" if advantaged else "-",
        str(sum(row.get("update/grad_norm") == 0 for row in steps)),
    ]
    return "| " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--methods", required=True, help="comma-separated, the reference first")
    parser.add_argument("--seeds", default="3", help="comma-separated seeds")
    args = parser.parse_args(argv)
    from tepo.compare.render import read_table

    try:
        table = read_table(args.directory)
    except FileNotFoundError as err:
        print(err, file=sys.stderr)
        return 2
    table_rows = {row["method"]: row for row in table["rows"]}
    head = [
        "method", "seed", "held-out", "Δ held-out vs reference", "sampled", "pass@1", "pass@8", "entropy kept",
        "all-equal groups per step", "their tokens advantaged (steps 2-)", "steps with no gradient",
    ]  # fmt: skip
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for method in args.methods.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            row = run_row(args.directory, table_rows, method, seed)
            if row is not None:
                print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
