"""The user-function payload of the reward pool: a call of one of the user's reward functions
(``user_functions.py``) with JSON keyword arguments, and its result.

A call that raises, returns a non-number or hangs scores 0 with status ``"error"`` or ``"timeout"`` and the
reason in ``detail``; one that returns scores ``"scored"`` with its value (a TRL-form call: its values, and the
indices of the elements that were not numbers).
"""

from __future__ import annotations

import json

from .results import RewardResult, RewardStats

CALL_STATUSES = ("scored", "timeout", "error")  # of a call of a user's reward function


def call_payloads(label: str, arguments: list[dict], labels: tuple[str, ...], caller: str) -> list[dict]:
    """One call request per mapping of ``arguments``; ValueError for an unknown ``label``, TypeError for
    arguments that are not JSON values."""
    if label not in labels:
        known = ", ".join(labels) or "none"
        raise ValueError(f"{caller}: no reward function {label!r} (loaded: {known})")
    payloads = [{"task": "call", "label": label, "arguments": a} for a in arguments]
    try:
        json.dumps(payloads)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{caller}: arguments must be JSON values ({err})") from None
    return payloads


def call_result(stats: RewardStats, status: str, seconds: float, detail: str, msg: dict) -> RewardResult:
    """A call's result: its value(s) when ``"scored"``, else 0 (the worker checked the values); counted in
    ``stats`` (under the pool's lock)."""
    status = status if status in CALL_STATUSES else "error"
    scored = status == "scored"
    values = tuple(float(v) for v in msg.get("values", ())) if scored else ()
    reward = float(msg.get("value", 0.0)) if scored else 0.0
    element_errors = tuple(int(i) for i in msg.get("element_errors", ())) if scored else ()
    stats.calls += 1
    stats.call_timeouts += status == "timeout"
    stats.call_errors += status == "error"
    return RewardResult(reward, status, None, seconds, detail, values, element_errors)
