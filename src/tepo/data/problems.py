"""A `Problem` is the only thing the rest of the pipeline sees: an id, the problem text and the gold answer as a
string (math-verify parses it later), and, for reward functions of the user's own
(``tepo.rewards.functions``), where it came from and the rest of its data row."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class DataError(ValueError):
    """Bad input data: the message names the file, line and field."""


@dataclass(frozen=True)
class Problem:
    """A row of a data set, as verl's ``compute_score`` reads it: ``answer`` is its ``ground_truth``,
    ``data_source`` the row's own ``data_source`` field if it has one, else the data set's name (a procedural
    task's name, a file's stem, a hub data set's name), and ``extra_info`` the row's other fields (JSON
    values; a row's own ``extra_info`` mapping is merged in, as verl's parquet rows keep it). See
    ``tepo.data.loading.row_extra_info``."""

    id: str
    problem: str
    answer: str
    data_source: str = ""
    extra_info: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
