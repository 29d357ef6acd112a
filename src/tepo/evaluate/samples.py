"""``samples.jsonl``: one line per finished problem, appended as batches finish; the resume log of ``tepo eval``.

A line holds the benchmark, the problem's position and id, the problem text, the gold answer, and every response
with its extracted answer, verdict status, whether it has a final ``\\boxed{}``, its length in tokens and whether it
was truncated, so a person can see why an answer was judged wrong. Lines are only appended and flushed per batch,
so a killed evaluation leaves complete lines plus at most one torn last line; :func:`read_samples` drops that
torn line (and cuts it from the file, so later appends start on a fresh line) and reports it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from tepo.evaluate.core import ProblemResult
from tepo.evaluate.metrics import has_final_box
from tepo.evaluate.settings import EvalError

SAMPLES_FILE = "samples.jsonl"
_REQUIRED = ("benchmark", "index", "id", "responses")


def problem_record(benchmark: str, index: int, result: ProblemResult) -> dict:
    """The ``samples.jsonl`` line of one scored problem (``index``: its position in the benchmark)."""
    responses = [
        {
            "text": text,
            "extracted": verdict.extracted,
            "status": verdict.status,
            "boxed": has_final_box(text),
            "tokens": int(length),
            "truncated": bool(truncated),
            "detail": verdict.detail,
            "vote": vote,  # answer class for cons@k (tepo.evaluate.voting): 0 correct, None no answer
            # the user's reward functions (tepo eval --reward-function): label -> [value, status, why it failed]
            **({"rewards": {label: list(pair) for label, pair in rewards.items()}} if rewards else {}),
        }
        for text, verdict, length, truncated, vote, rewards in zip(
            result.responses,
            result.verdicts,
            result.lengths,
            result.truncated,
            result.votes or [0 if v.status == "correct" else None for v in result.verdicts],
            result.rewards or [{}] * len(result.verdicts),
            strict=True,
        )
    ]
    return {
        "benchmark": benchmark,
        "index": index,
        "id": result.problem.id,
        "problem": result.problem.problem,
        "gold": result.problem.answer,
        "num_samples": len(responses),
        "num_correct": sum(r["status"] == "correct" for r in responses),
        "responses": responses,
    }


def read_samples(path: Path, warn: Callable[[str], None] = print) -> list[dict]:
    """All complete records of ``path`` (none if it does not exist). A torn final line (a kill mid-write) is
    reported through ``warn`` and cut from the file; a bad line anywhere else is an error naming the line."""
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    records, offset = [], 0
    lines = data.split(b"\n")
    for line_no, raw in enumerate(lines, start=1):
        is_last = line_no == len(lines)
        if not raw.strip():
            offset += len(raw) + (0 if is_last else 1)
            continue
        record = _parse(raw)
        if record is None:
            # Torn: the last line, or the line before a trailing newline that a kill could not have written.
            if is_last or (line_no == len(lines) - 1 and not lines[-1].strip()):
                warn(
                    f"{path}:{line_no}: dropping an incomplete last line (the evaluation was interrupted while "
                    "writing it); that problem will be redone"
                )
                with open(path, "r+b") as handle:
                    handle.truncate(offset)
                break
            raise EvalError(
                f"{path}:{line_no}: not a sample record (expected one JSON object with fields "
                f"{list(_REQUIRED)}); move the file away or pass --overwrite to start again"
            )
        records.append(record)
        offset += len(raw) + (0 if is_last else 1)
    return records


def _parse(raw: bytes) -> dict | None:
    try:
        record = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(record, dict) or any(k not in record for k in _REQUIRED):
        return None
    if not isinstance(record["responses"], list):
        return None
    return record


def append_samples(path: Path, records: Iterable[dict]) -> None:
    """Append records, one JSON line each, and flush them to disk before returning."""
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    if not lines:
        return
    with open(path, "a", encoding="utf-8", errors="replace") as handle:
        handle.write(lines)
        handle.flush()
        os.fsync(handle.fileno())
