"""A finished run's headline numbers (``summary.json``): held-out scores before and after, the reward and
entropy trends, the median step time; read from the run's metrics log by their grouped names.

The held-out scores in a run directory's files (``summary.json``'s ``before`` and ``after``, ``eval_before.json``)
keep the keys every run directory has held, which ``tepo compare`` and ``tepo report`` read (``eval_<what>``,
``eval_seconds``); :func:`scores_on_disk` and :func:`scores_from_disk` are the one place that spells them.
"""

from __future__ import annotations

from pathlib import Path

from tepo.metrics import read_metrics


def scores_on_disk(scores: dict) -> dict:
    """Held-out scores named as a metrics row logs them (``eval/greedy_accuracy``, ``time/eval_seconds``) with
    the keys of the run directory's files (``eval_greedy_accuracy``, ``eval_seconds``)."""
    return {key.replace("/", "_", 1).removeprefix("time_"): value for key, value in scores.items()}


def scores_from_disk(saved: dict) -> dict:
    """The inverse of :func:`scores_on_disk`: a file's held-out scores with their logged names."""
    return {
        ("time/" + key if key == "eval_seconds" else key.replace("_", "/", 1)): value
        for key, value in saved.items()
    }


def summarize(run_dir: Path, before: dict, after: dict) -> dict:
    """The run's headline numbers: held-out scores before/after (``before``, ``after``: with their logged names,
    kept with the files' keys), reward and entropy trends, median step time."""
    rows = read_metrics(Path(run_dir) / "metrics.jsonl")
    rewards = _numbers(rows, "reward/mean")
    third = max(1, len(rewards) // 3)
    step_times = _numbers(rows, "time/step_seconds")
    entropies = _numbers(rows, "update/entropy_mean")
    return {
        "steps": len(rows),
        "before": scores_on_disk(before),
        "after": scores_on_disk(after),
        "reward_first_third": sum(rewards[:third]) / third if rewards else None,
        "reward_last_third": sum(rewards[-third:]) / third if rewards else None,
        "entropy_first": entropies[0] if entropies else None,
        "entropy_last": entropies[-1] if entropies else None,
        "seconds_per_step_median": sorted(step_times)[len(step_times) // 2] if step_times else None,
    }


def _numbers(rows: list[dict], key: str) -> list:
    return [r[key] for r in rows if isinstance(r.get(key), int | float)]
