"""``RewardPool``: rewards computed in sandboxed worker processes with hard per-item timeouts: math-verify's
verdicts and the user's own reward functions.

The workers, their deadlines and their logs are ``sandbox.SandboxedPool``'s; what a request holds and what its
result becomes: ``math_items.py`` (a math-verify verification, ``submit``) and ``call_items.py`` (a call of the
user's function, ``submit_calls``). A worker's start-up is its math-verify import, a warm-up verification and the
import of the user's functions.

Reward functions of the user's own (``functions``: ``{label, path, name}`` mappings, ``user_functions.py``)
are imported by every worker at start-up and called through ``submit_calls`` under the same deadlines: a
call that raises, returns a non-number or hangs scores 0 with status ``"error"`` or ``"timeout"`` and the reason
in ``detail``; one that returns scores ``"scored"`` with its value. These calls are counted apart from the math
verifications (``calls``...).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from .answers import ANSWER_FORMATS, DEFAULT_MAX_CHARS
from .call_items import call_payloads, call_result
from .failures import RewardFailures
from .math_items import math_payloads, math_result
from .results import RewardFuture, RewardResult
from .sandbox import SandboxedPool, _Item


class RewardPool(SandboxedPool):
    """Rewards in sandboxed workers, safe against hostile completions: math-verify's 0/1 verdicts and calls of
    the user's reward functions.

    Args:
        num_workers: worker processes (each about 60-150 MB resident).
        timeout_s: hard limit per item, from hand-off to a worker until its result; the worker is killed and
            replaced on overrun and the item scores 0 (``"timeout"``).
        answer_format: one of ``ANSWER_FORMATS`` (see ``tepo.rewards.answers``).
        max_chars: only the last ``max_chars`` characters of a completion are verified.
        memory_limit_mb: ``RLIMIT_AS`` of each worker (0: no limit). The default leaves a wide margin over
            normal sympy use (about 70 MB virtual after warm-up, under 200 MB on megabyte inputs).
        soft_fraction: the in-worker SIGALRM deadline as a fraction of ``timeout_s``.
        startup_timeout_s: how long a new worker may take to import math-verify and report ready.
        functions: the user's reward functions, ``{label, path, name}`` mappings, each imported by every
            worker at start-up (``path`` a ``.py`` file or a module name; ``submit_calls`` names a ``label``).
        log_dir: where each worker's stdout and stderr go (``reward_worker_<slot>.log``; a run directory);
            None: temporary files.
        failures: where ``functions.score_responses`` reports the user's functions' failures (a console
            warning, a file, a stop: ``failures.RewardFailures``); None: they only score 0 and are counted.

    Use as a context manager or call ``close()``. ``stats`` returns a snapshot of the cumulative counters.
    """

    name = "RewardPool"

    def __init__(
        self,
        num_workers: int = 2,
        timeout_s: float = 5.0,
        *,
        answer_format: str = "boxed_or_last",
        max_chars: int = DEFAULT_MAX_CHARS,
        memory_limit_mb: int = 1024,
        soft_fraction: float = 0.8,
        startup_timeout_s: float = 60.0,
        functions: Sequence[Mapping[str, str]] = (),
        log_dir: str | Path | None = None,
        failures: RewardFailures | None = None,
    ):
        if not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"RewardPool: num_workers must be an int >= 1, got {num_workers!r}")
        if not timeout_s > 0:
            raise ValueError(f"RewardPool: timeout_s must be > 0 seconds, got {timeout_s!r}")
        if answer_format not in ANSWER_FORMATS:
            raise ValueError(f"RewardPool: answer_format={answer_format!r} is not one of {ANSWER_FORMATS}")
        if not isinstance(max_chars, int) or max_chars < 1:
            raise ValueError(f"RewardPool: max_chars must be an int >= 1, got {max_chars!r}")
        if not 0 < soft_fraction <= 1:
            raise ValueError(f"RewardPool: soft_fraction must be in (0, 1], got {soft_fraction!r}")
        self.failures = failures
        self.answer_format = answer_format
        self.max_chars = max_chars
        self.function_labels = tuple(f["label"] for f in functions)
        functions_json = json.dumps(
            [{key: str(f[key]) for key in ("label", "path", "name")} for f in functions]
        )
        self._start(
            num_workers,
            timeout_s,
            memory_limit_mb=memory_limit_mb,
            soft_fraction=soft_fraction,
            startup_timeout_s=startup_timeout_s,
            functions_json=functions_json,
            log_dir=None if log_dir is None else Path(log_dir),
        )

    def submit(
        self, responses: list[str], answers: list[str], *, answer_format: str | None = None
    ) -> RewardFuture:
        """Queue ``responses[i]`` against gold ``answers[i]``; returns at once with a ``RewardFuture``."""
        fmt = self.answer_format if answer_format is None else answer_format
        payloads = math_payloads(responses, answers, fmt, self.max_chars, "RewardPool.submit")
        return self._queue(payloads, "submit")

    def submit_calls(self, label: str, arguments: list[dict]) -> RewardFuture:
        """Queue one call of the user's reward function ``label`` per mapping of ``arguments`` (its keyword
        arguments, JSON values only; see ``user_functions.py``); returns at once with a ``RewardFuture``."""
        payloads = call_payloads(label, arguments, self.function_labels, "RewardPool.submit_calls")
        return self._queue(payloads, "submit_calls")

    def score(
        self, responses: list[str], answers: list[str], *, answer_format: str | None = None
    ) -> list[RewardResult]:
        """Blocking ``submit(...).result()``."""
        return self.submit(responses, answers, answer_format=answer_format).result()

    def _deliver(self, item: _Item, status: str, extracted, seconds: float, detail: str, msg: dict):
        if item.payload.get("task") == "call":
            return call_result(self._stats, status, seconds, detail, msg)
        return math_result(self._stats, status, extracted, seconds, detail, msg)
