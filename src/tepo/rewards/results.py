"""What the reward pool hands back: one ``RewardResult`` per scored item, ``RewardStats`` its counters, and the
``RewardFuture`` a caller waits on."""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class RewardResult:
    """Outcome of one completion. ``reward`` is 1.0 for ``"correct"`` and 0.0 for every other status.

    ``seconds``: wall time from hand-off to a worker until the result (queueing excluded).
    ``detail``: why, for ``"timeout"`` and ``"error"`` (empty otherwise; for a batched call that scored, the
    first element error's reason).
    A call of a user's reward function (``submit_calls``) has status ``"scored"`` and its value as ``reward``;
    a batched (TRL-form) call has its values in ``values`` and the indices of those that were errors (scored
    0) in ``element_errors`` (``values`` is empty when the call failed as a whole).
    """

    reward: float
    status: str
    extracted: str | None
    seconds: float
    detail: str = ""
    values: tuple[float, ...] = ()
    element_errors: tuple[int, ...] = ()


@dataclass
class RewardStats:
    """Cumulative counters of a pool. ``timeouts`` counts both soft (in-worker) and hard (killed) timeouts;
    ``parse_failures``: an answer was extracted but math-verify could not make a sympy object of it."""

    items: int = 0
    correct: int = 0
    wrong: int = 0
    no_answer: int = 0
    timeouts: int = 0
    hard_timeouts: int = 0
    parse_failures: int = 0
    worker_restarts: int = 0
    errors: int = 0
    calls: int = 0  # calls of user reward functions, and how many of them timed out or failed
    call_timeouts: int = 0
    call_errors: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class RewardFuture:
    """Results of one ``submit``; ``result()`` blocks until every item is scored."""

    def __init__(self, n: int):
        self._results: list[RewardResult | None] = [None] * n
        self._remaining = n
        self._done = threading.Event()
        self._error: BaseException | None = None
        if n == 0:
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> list[RewardResult]:
        if not self._done.wait(timeout):
            raise TimeoutError(f"reward results not ready after {timeout} s")
        if self._error is not None:
            raise self._error
        return list(self._results)  # type: ignore[arg-type]

    def _set(self, index: int, result: RewardResult) -> None:
        self._results[index] = result
        self._remaining -= 1
        if self._remaining == 0:
            self._done.set()

    def _fail(self, error: BaseException) -> None:
        if not self._done.is_set():
            self._error = error
            self._done.set()
