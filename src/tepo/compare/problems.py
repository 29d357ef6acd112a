"""The problem-level view of a comparison: method against reference, problem by problem, summed over seeds.

Where a method's run and the reference's run of the same seed both wrote per-problem records of the trained
policy (``held_out/after.jsonl``, :mod:`tepo.evaluate.records`) on the same problems, each problem's greedy
outcome gives a difference in {-1, 0, 1}. Over the seeds paired this way:

- ``only_method`` / ``only_reference``: the (seed, problem) pairs that only one of the two solved (the discordant
  pairs of McNemar's table), and ``both`` / ``neither``;
- the mean difference with a two-way bootstrap interval that resamples seeds and problems
  (:func:`tepo.compare.stats.two_way_bootstrap`), so it speaks for new training seeds and new problems alike.

Problems are matched by their key (text and answer digest), on the problems every paired seed has; a run
without records (made before they were written) leaves its seed out of the view.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tepo.compare.stats import two_way_bootstrap
from tepo.evaluate.records import AFTER, read_problem_records, records_path


def _greedy(records: dict[str, dict], keys: list[str]) -> np.ndarray:
    return np.array([records[k].get("greedy_correct", 0) for k in keys], dtype=np.float64)


def problem_view(
    method_runs: dict[int, Path], reference_runs: dict[int, Path], seeds: list[int]
) -> dict | None:
    """The view of one method against the reference over ``seeds`` (those the table paired); None when no seed
    has records on both sides."""
    pairs = {}
    for seed in seeds:
        mine = read_problem_records(records_path(method_runs[seed], AFTER))
        theirs = read_problem_records(records_path(reference_runs[seed], AFTER))
        if mine and theirs:
            pairs[seed] = (mine, theirs)
    if not pairs:
        return None
    common = set.intersection(*(set(m) & set(r) for m, r in pairs.values()))
    keys = sorted(common)
    if not keys:
        return None
    method = np.stack([_greedy(m, keys) for m, _ in pairs.values()])
    reference = np.stack([_greedy(r, keys) for _, r in pairs.values()])
    view = {
        "seeds": sorted(pairs),
        "problems": len(keys),
        "only_method": int(np.sum((method > 0) & (reference == 0))),
        "only_reference": int(np.sum((method == 0) & (reference > 0))),
        "both": int(np.sum((method > 0) & (reference > 0))),
        "neither": int(np.sum((method == 0) & (reference == 0))),
    }
    return view | two_way_bootstrap(method - reference)


def problem_level(
    runs: dict[str, dict[int, Path]], reference: str, paired_seeds: dict[str, list[int]]
) -> dict[str, dict]:
    """``{method: view}`` for every method with records paired against the reference (see the module docstring)."""
    out = {}
    for method, seeds in paired_seeds.items():
        if method == reference or not seeds:
            continue
        view = problem_view(runs[method], runs[reference], seeds)
        if view is not None:
            out[method] = view
    return out
