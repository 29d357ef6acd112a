"""Plain-text tables for the terminal (and Markdown, which the same layout is)."""

from __future__ import annotations

from collections.abc import Sequence


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        return f"{value:.3f}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def format_table(headers: Sequence[str], rows: Sequence[Sequence], *, markdown: bool = True) -> str:
    """A Markdown table with aligned columns (readable as plain text too)."""
    cells = [[_fmt(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = lambda values: "| " + " | ".join(v.ljust(w) for v, w in zip(values, widths)) + " |"  # noqa: E731
    out = [line(list(headers)), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in cells]
    return "\n".join(out)


def training_summary_table(summary: dict) -> str:
    before, after = summary.get("before", {}), summary.get("after", {})
    rows = [
        ["held-out greedy accuracy", before.get("eval_greedy_accuracy"), after.get("eval_greedy_accuracy")],
        [
            "held-out sampled accuracy",
            before.get("eval_sampled_accuracy"),
            after.get("eval_sampled_accuracy"),
        ],
        [
            "batch reward (first / last third of steps)",
            summary.get("reward_first_third"),
            summary.get("reward_last_third"),
        ],
        ["mean token entropy (first / last step)", summary.get("entropy_first"), summary.get("entropy_last")],
    ]
    table = format_table(["metric", "before", "after"], rows)
    per_step = summary.get("seconds_per_step_median")
    tail = f"\nsteps: {summary.get('steps')}   median time per step: {_fmt(per_step)} s"
    return table + tail
