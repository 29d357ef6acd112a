"""Failures of the user's reward functions, made loud: a console line, a file, and a stop.

A call of a user's function that raises, returns something that is not a number or runs past
``reward.timeout_s`` scores 0 (``pool.py``). So that a run cannot train for hours on a reward that never ran,
``RewardFailures`` (attached to a pool as ``pool.failures``; ``functions.score_responses`` reports to it):

- warns once per function, on its first failure: the response's index in the batch and the reason (the
  exception's type, message and line, or the type it returned);
- appends each failure to a JSON-lines file (``reward_failures.jsonl`` in a run directory): the step, the
  function, the status, the reason and the response's first ``RESPONSE_CHARS`` characters (at most
  ``ROWS_PER_BATCH`` rows per function and batch);
- raises ``RewardFunctionsFailing`` when a function failed on at least ``stop_share`` of its responses in one
  batch (a training step, an evaluation batch): ``reward.stop_failure_share``, 1 by default (every one failed);
  None never stops.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

FAILURES_FILE = "reward_failures.jsonl"
RESPONSE_CHARS = 300
ROWS_PER_BATCH = 16


class RewardFunctionsFailing(RuntimeError):
    """A reward function of the user's failed on too large a share of a batch; the message is one paragraph
    that names the function, the share, the first reason and where the details are."""


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class RewardFailures:
    """The record of the user's reward functions' failures (see the module doc).

    Args:
        path: the failures file (None: no file).
        stop_share: a function's share of failed responses in one batch at which ``record`` raises
            ``RewardFunctionsFailing`` (None: never).
        log: where the one-line warnings go (default: stderr).
        resume_hint: a sentence added to the stop message (how to go on once the function is fixed).
        defer_stop: keep the stop for ``raise_if_stopped`` instead of raising in ``record`` (an evaluation
            writes the batch's records, failures and all, first).
    """

    def __init__(
        self,
        path: str | Path | None,
        *,
        stop_share: float | None = 1.0,
        log: Callable[[str], None] = _stderr,
        resume_hint: str = "",
        defer_stop: bool = False,
    ):
        self.path = None if path is None else Path(path)
        self.stop_share = stop_share
        self.log = log
        self.resume_hint = resume_hint
        self.defer_stop = defer_stop
        self.stop: RewardFunctionsFailing | None = None
        self.warned: set[str] = set()
        self.failed: dict[str, int] = {}  # per function, responses that failed so far

    def record(self, scored, texts: Sequence[str], step: int | None = None) -> None:
        """Report the failures of one batch's ``scored`` (``functions.ScoredResponses``) of ``texts``."""
        where = "" if step is None else f" in step {step}"
        for label, statuses in scored.statuses.items():
            failed = [i for i, status in enumerate(statuses) if status != "scored"]
            if not failed:
                continue
            details = scored.details.get(label) or [""] * len(statuses)
            self.failed[label] = self.failed.get(label, 0) + len(failed)
            if label not in self.warned:
                self.warned.add(label)
                i = failed[0]
                self.log(
                    f"warning: reward function {label!r} failed on response {i}{where}: {_reason(statuses[i], details[i])}"
                    f"{self._see()} (later failures are counted in reward/{label}_errors and _timeouts)"
                )
            self._write(label, failed, statuses, details, texts, step)
            self._check(label, failed, statuses, details, where)
        if self.stop is not None and not self.defer_stop:
            self.raise_if_stopped()

    def raise_if_stopped(self) -> None:
        """Raise the ``RewardFunctionsFailing`` a batch ran into, if one did."""
        if self.stop is not None:
            stop, self.stop = self.stop, None
            raise stop

    def _see(self) -> str:
        return "" if self.path is None else f"; every failure: {self.path}"

    def _write(self, label, failed, statuses, details, texts, step) -> None:
        if self.path is None:
            return
        rows = [
            {
                "step": step,
                "function": label,
                "index": i,
                "status": statuses[i],
                "detail": details[i],
                "response": texts[i][:RESPONSE_CHARS],
            }
            for i in failed[:ROWS_PER_BATCH]
        ]
        with open(self.path, "a", encoding="utf-8") as f:
            f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)

    def _check(self, label, failed, statuses, details, where) -> None:
        share = len(failed) / len(statuses)
        if self.stop_share is None or share < self.stop_share:
            return
        i = failed[0]
        message = (
            f"reward function {label!r} failed on {len(failed)} of its {len(statuses)} responses{where} "
            f"(reward.stop_failure_share={self.stop_share:g}); the first: {_reason(statuses[i], details[i])}. "
            f"Details{'' if self.path is None else ' in ' + str(self.path)}. Check the function with "
            "`tepo reward check FILE:NAME --data ROWS.jsonl`"
        )
        hint = f"; {self.resume_hint}" if self.resume_hint else ""
        self.stop = self.stop or RewardFunctionsFailing(message + hint)


def _reason(status: str, detail: str) -> str:
    if status == "timeout":
        return (
            f"ran past reward.timeout_s ({detail})"
            if detail and detail != "timeout"
            else "ran past reward.timeout_s"
        )
    return detail or status
