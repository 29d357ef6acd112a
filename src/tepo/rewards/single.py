"""``math_equal``: one gold-vs-prediction comparison, through a pool (never in the caller's process)."""

from __future__ import annotations

import threading

from .pool import RewardPool

_shared_pool: RewardPool | None = None
_shared_lock = threading.Lock()


def _default_pool() -> RewardPool:
    # One lazily started single-worker pool serves every call without a pool (about 0.5-1 s to start once);
    # it is closed at interpreter exit by the pool module's atexit hook.
    global _shared_pool
    with _shared_lock:
        if _shared_pool is None or _shared_pool._closed:
            _shared_pool = RewardPool(num_workers=1, timeout_s=5.0, answer_format="raw")
        return _shared_pool


def math_equal(gold: str, pred: str, *, pool: RewardPool | None = None) -> bool:
    """Whether answer ``pred`` equals gold answer ``gold`` under math-verify (e.g. ``\\frac{1}{2}`` vs ``0.5``).

    ``pred`` is an answer, not a completion: the whole string is compared (or its last ``\\boxed{}``, if any).
    A timeout or error counts as not equal. Runs in ``pool`` if given, else in a shared one-worker pool.
    """
    pool = pool if pool is not None else _default_pool()
    (result,) = pool.score([pred], [gold], answer_format="raw")
    return result.status == "correct"
