"""Two methods of a `tepo compare` directory, seed by seed: how long their runs stay on the same trajectory, and
whether their gradients differ by the factor theory says while they do. A check of the harness, not a ranking.

    python scripts/paired_runs.py docs/results/tepo-claims tepo luspo --scale response_length_mean

At one seed, two methods sample the same first rollout. While the runs' weights agree, their rollouts agree too,
so a step's logged rollout statistics (tokens generated, mean length, mean reward, unanswered count) match. The
first step where they differ is where the trajectories part. Up to there, if method B's loss is method A's times
a per-batch constant, the ratio of their pre-clip gradient norms must equal that constant at every step with a
non-zero gradient. `--scale` is that constant: a number (`1` where the two gradients should be equal: SAPO
against GRPO at ratio 1) or the metric of A's row that holds it (`response_length_mean` for LUSPO,
seq-mean-token-sum, against TEPO, token-mean, whose ratio is T_tot / N_seq). Finished runs only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tepo.metrics import metric_name, read_metrics

# Logged per step by every run: equal values at one step mean the two engines sampled alike. Metric names are
# the grouped ones (tepo.metrics.names) that read_metrics gives for old and new logs alike.
ROLLOUT_FINGERPRINT = (
    "rollout/gen_tokens",
    "rollout/response_length_mean",
    "reward/mean",
    "reward/no_answer",
)


def step_rows(run_dir: Path) -> dict[int, dict]:
    # Training steps only: evaluation rows carry no reward/mean.
    return {int(row["step"]): row for row in read_metrics(run_dir / "metrics.jsonl") if "reward/mean" in row}


def scale_value(row: dict, scale: str) -> float:
    """``scale`` is a number (``1``: the same gradient) or the name of a metric of the step's row, grouped
    (``rollout/response_length_mean``) or flat as runs before the grouping logged it (``response_length_mean``)."""
    try:
        return float(scale)
    except ValueError:
        return float(row[metric_name(scale)])


def compare_seed(run_a: Path, run_b: Path, scale: str | None) -> dict:
    rows_a, rows_b = step_rows(run_a), step_rows(run_b)
    shared = sorted(set(rows_a) & set(rows_b))
    parted = next(
        (s for s in shared if any(rows_a[s].get(k) != rows_b[s].get(k) for k in ROLLOUT_FINGERPRINT)), None
    )
    same_steps = [s for s in shared if parted is None or s < parted]
    deviations = []
    for step in same_steps:
        norm_a, norm_b = (
            rows_a[step].get("update/grad_norm") or 0.0,
            rows_b[step].get("update/grad_norm") or 0.0,
        )
        if norm_a > 0 and norm_b > 0 and scale:
            deviations.append(abs(norm_b / norm_a / scale_value(rows_a[step], scale) - 1.0))
    final = [
        json.loads((r / "summary.json").read_text())["after"]["eval_greedy_accuracy"] for r in (run_a, run_b)
    ]
    return {
        "same_until": same_steps[-1] if same_steps else 0,
        "parted_at": parted,
        "gradient_steps": len(deviations),
        "max_scale_deviation": max(deviations) if deviations else None,
        "held_out_a": final[0],
        "held_out_b": final[1],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("method_a")
    parser.add_argument("method_b")
    parser.add_argument(
        "--scale", help="a number, or the metric of A's step row, that B's gradient norm should be A's times"
    )
    args = parser.parse_args(argv)
    seeds = sorted(
        p.parent.name
        for p in (args.directory / args.method_a).glob("seed*/summary.json")
        if (args.directory / args.method_b / p.parent.name / "summary.json").exists()
    )
    if not seeds:
        print(
            f"{args.directory}: no seed finished by both {args.method_a} and {args.method_b}", file=sys.stderr
        )
        return 2
    a, b = args.method_a, args.method_b
    ratio_header = f"max \\|(‖g_{b}‖ / ‖g_{a}‖) / {args.scale} − 1\\|" if args.scale else "-"
    print(
        f"| seed | same rollouts through step | parted at | gradient steps compared | {ratio_header} "
        f"| held-out {a} | held-out {b} | {b} − {a} |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for seed in seeds:
        r = compare_seed(args.directory / a / seed, args.directory / b / seed, args.scale)
        dev = (
            "-" if r["max_scale_deviation"] is None else f"{r['max_scale_deviation']:.2g}"
        )  # 0: bit-equal norms
        print(
            f"| {seed.removeprefix('seed')} | {r['same_until']} | {r['parted_at'] or 'never'} "
            f"| {r['gradient_steps']} | {dev} | {r['held_out_a']:.3f} | {r['held_out_b']:.3f} "
            f"| {r['held_out_b'] - r['held_out_a']:+.3f} |"
        )
    print(
        f"\nsame rollouts: equal {', '.join(ROLLOUT_FINGERPRINT)} at every step so far; gradient steps: those "
        "of them with a non-zero gradient in both runs (pre-clip norms)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
