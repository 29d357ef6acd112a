"""A `Problem` is the only thing the rest of the pipeline sees: an id, the problem text and the gold answer as a
string (math-verify parses it later)."""

from __future__ import annotations

from dataclasses import dataclass


class DataError(ValueError):
    """Bad input data: the message names the file, line and field."""


@dataclass(frozen=True)
class Problem:
    id: str
    problem: str
    answer: str
