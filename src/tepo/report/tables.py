"""The training summary as a plain-text table (the layout is :func:`tepo.metrics.tables.format_table`'s)."""

from __future__ import annotations

from tepo.metrics.tables import format_cell, format_table

__all__ = ["format_table", "training_summary_table"]


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
    tail = f"\nsteps: {summary.get('steps')}   median time per step: {format_cell(per_step)} s"
    precision = summary.get("precision")
    if isinstance(precision, dict):  # runs since 2026-12-05 record it (tepo.precision)
        kind = "bf16 autocast" if precision.get("model_autocast_bf16") else "float32"
        tail += f"   precision: {kind} on {precision.get('hardware', '?')}"
    return table + tail
