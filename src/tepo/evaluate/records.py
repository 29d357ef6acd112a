"""Per-problem records of a held-out evaluation: what each problem scored, so that two runs scored on the same
problems can be compared problem by problem (``tepo.compare.problems``).

One JSON line per problem, in the held-out set's order::

    {"id": "arithmetic-mix-test-3-L1", "key": "5f0c...", "greedy_correct": 1,
     "sampled_correct": 1, "samples": 1, "pass_k_correct": 5, "pass_k_samples": 8}

``key`` is a digest of the problem text and its reference answer: ids of procedural tasks are positions, so two
draws of different problems can share an id, and records are matched by ``key``. A pass that did not run leaves
its fields out. The files of a run live in ``<run_dir>/held_out/``: ``before.jsonl`` (the initial policy),
``after.jsonl`` (the trained policy) and ``step<N>.jsonl`` (the evaluations during training).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from tepo.data import Problem
from tepo.files import atomic_write_text

RECORDS_DIR = "held_out"
BEFORE, AFTER = "before", "after"
# Pass name (tepo.training.evaluation) -> the fields its correct count and sample count are written under.
_PASS_FIELDS = {
    "greedy": ("greedy_correct", None),
    "sampled": ("sampled_correct", "samples"),
    "pass_k": ("pass_k_correct", "pass_k_samples"),
}


def problem_key(problem: Problem) -> str:
    """A digest of the problem text and its answer: equal keys mean the same problem, whatever its id."""
    return hashlib.sha256(f"{problem.problem}\x00{problem.answer}".encode()).hexdigest()[:16]


def records_path(run_dir: Path, label: str) -> Path:
    """``<run_dir>/held_out/<label>.jsonl`` (label ``before``, ``after`` or ``step<N>``)."""
    return Path(run_dir) / RECORDS_DIR / f"{label}.jsonl"


def problem_records(problems: Sequence[Problem], passes: Mapping[str, Sequence]) -> list[dict]:
    """One record per problem from each pass's ``ProblemResult`` list (``passes``: pass name -> results in the
    problems' order)."""
    records = [{"id": p.id, "key": problem_key(p)} for p in problems]
    for name, results in passes.items():
        correct_field, samples_field = _PASS_FIELDS[name]
        for record, result in zip(records, results, strict=True):
            record[correct_field] = int(result.num_correct)
            if samples_field is not None:
                record[samples_field] = len(result.verdicts)
    return records


def write_problem_records(path: Path, records: Sequence[dict]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in records))


def read_problem_records(path: Path) -> dict[str, dict] | None:
    """``{key: record}`` of a records file; None when the file is absent or unreadable (a run made before
    per-problem records were written has none)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        records = [json.loads(line) for line in lines if line.strip()]
    except (OSError, json.JSONDecodeError):
        return None
    return {r["key"]: r for r in records if isinstance(r, dict) and "key" in r}
