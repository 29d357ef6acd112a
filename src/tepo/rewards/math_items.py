"""The math-verify payload of the reward pool: what a verification request holds, and its result.

Completions lose their trailer (padding, end-of-text markers) and are then cut to their last ``max_chars``
characters in the parent before anything is sent, so a worker never gets more than ``max_chars`` characters (see
``answers.py``); lone surrogates and control characters are replaced (see ``sanitize``). The worker side is
``answers.verify_item``.
"""

from __future__ import annotations

import re

from .answers import ANSWER_FORMATS, tail
from .results import RewardResult, RewardStats

STATUSES = ("correct", "wrong", "no_answer", "timeout", "error")
# Lone surrogates (invalid UTF-8 decoded with "surrogateescape") become U+FFFD so results stay writable as UTF-8;
# C0 control characters other than tab/newline/CR, and DEL, mean nothing in LaTeX and become spaces.
_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def sanitize(text: str, max_chars: int) -> str:
    """What the worker gets: at most ``max_chars`` characters, the last ones before the trailer (``tail``), with
    lone surrogates and control characters replaced."""
    return _CONTROL.sub(" ", _LONE_SURROGATE.sub("\ufffd", tail(text, max_chars)))


def math_payloads(responses, answers, fmt: str, max_chars: int, caller: str) -> list[dict]:
    """One verification request per ``(response, gold answer)`` pair; ValueError/TypeError, one line, on a
    format that is not one of ``ANSWER_FORMATS``, unequal lengths or a value that is not a string."""
    if fmt not in ANSWER_FORMATS:
        raise ValueError(f"{caller}: answer_format={fmt!r} is not one of {ANSWER_FORMATS}")
    responses, answers = list(responses), list(answers)
    if len(responses) != len(answers):
        raise ValueError(
            f"{caller}: got {len(responses)} responses but {len(answers)} answers; "
            "expected one gold answer per response"
        )
    for name, values in (("responses", responses), ("answers", answers)):
        for i, v in enumerate(values):
            if not isinstance(v, str):
                raise TypeError(
                    f"{caller}: {name}[{i}] is {type(v).__name__}, expected str "
                    "(decode bytes first, e.g. with errors='replace')"
                )
    return [
        {
            "gold": sanitize(gold, max_chars),
            "response": sanitize(response, max_chars),
            "format": fmt,
            "max_chars": max_chars,
        }
        for response, gold in zip(responses, answers)
    ]


def math_result(
    stats: RewardStats, status: str, extracted: str | None, seconds: float, detail: str, msg: dict
) -> RewardResult:
    """A verification's result (1 for ``"correct"``, else 0), counted in ``stats`` (under the pool's lock)."""
    stats.items += 1
    stats.correct += status == "correct"
    stats.wrong += status == "wrong"
    stats.no_answer += status == "no_answer"
    stats.timeouts += status == "timeout"
    stats.errors += status == "error"
    stats.parse_failures += bool(msg.get("parse_failure"))
    return RewardResult(1.0 if status == "correct" else 0.0, status, extracted, seconds, detail)
