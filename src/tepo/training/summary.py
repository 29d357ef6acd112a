"""A finished run's headline numbers (``summary.json``): held-out scores before and after, the reward and
entropy trends, the median step time; read from the run's metrics log by their grouped names."""

from __future__ import annotations

from pathlib import Path

from tepo.metrics import read_metrics


def summarize(run_dir: Path, before: dict, after: dict) -> dict:
    """The run's headline numbers: held-out scores before/after, reward and entropy trends, median step time."""
    rows = read_metrics(Path(run_dir) / "metrics.jsonl")
    rewards = _numbers(rows, "reward/mean")
    third = max(1, len(rewards) // 3)
    step_times = _numbers(rows, "time/step_seconds")
    entropies = _numbers(rows, "update/entropy_mean")
    return {
        "steps": len(rows),
        "before": before,
        "after": after,
        "reward_first_third": sum(rewards[:third]) / third if rewards else None,
        "reward_last_third": sum(rewards[-third:]) / third if rewards else None,
        "entropy_first": entropies[0] if entropies else None,
        "entropy_last": entropies[-1] if entropies else None,
        "seconds_per_step_median": sorted(step_times)[len(step_times) // 2] if step_times else None,
    }


def _numbers(rows: list[dict], key: str) -> list:
    return [r[key] for r in rows if isinstance(r.get(key), int | float)]
