"""Loading problems from a procedural task name, a JSONL/Parquet path or a Hugging Face dataset name.

Bad input fails before any model is loaded, with one message naming the file, the line and the field.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from tepo.data.problems import DataError, Problem
from tepo.data.tasks import PROCEDURAL_TASKS, make_task_problems
from tepo.hub import check_hub, offline_note


def load_problems(
    source: str,
    *,
    problem_field: str = "problem",
    answer_field: str = "answer",
    id_field: str = "id",
    split: str = "train",
    limit: int | None = None,
    seed: int = 0,
    subset: str | None = None,
) -> list[Problem]:
    """Load problems from a procedural task name, a JSONL/Parquet path, or a Hugging Face dataset name.

    For procedural tasks ``split`` selects disjoint problem streams (``train`` vs ``test``) and ``limit`` how
    many to make (default 1,000). For files, every row must have a non-empty ``problem_field`` and
    ``answer_field`` (numbers are accepted for the answer and turned into strings). For a Hugging Face dataset,
    ``subset`` names its configuration (``load_dataset(name, subset, split=split)``), e.g. ``en`` of
    ``open-r1/DAPO-Math-17k-Processed``.

    Each row's ``data_source`` and ``extra_info`` (what a reward function of the user's own gets, see
    :class:`Problem`) are its own ``data_source`` field, else the data set's name (the file's stem, the hub
    name), and its other fields (:func:`row_extra_info`).
    """
    if source in PROCEDURAL_TASKS:
        return make_task_problems(source, limit or 1000, split=split, seed=seed)
    path = Path(source).expanduser()
    if path.exists() or source.endswith((".jsonl", ".json", ".parquet")):
        problems = _load_file(path, problem_field, answer_field, id_field)
        problems = [_with_source(p, path.stem) for p in problems]
    else:
        problems = _load_hub(source, split, problem_field, answer_field, id_field, subset)
        problems = [_with_source(p, source) for p in problems]
    if not problems:
        raise DataError(f"{source}: no problems found (the file or split is empty)")
    return problems[:limit] if limit else problems


def _load_file(path: Path, problem_field: str, answer_field: str, id_field: str) -> list[Problem]:
    if not path.exists():
        raise DataError(f"{path}: no such file")
    if path.is_dir():
        raise DataError(f"{path}: is a directory; expected a .jsonl or .parquet file")
    if path.suffix == ".parquet":
        return _load_parquet(path, problem_field, answer_field, id_field)
    problems = []
    with open(path, "rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            try:
                # A byte-order mark (files saved by some Windows editors) is not part of the first row.
                text = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
            except UnicodeDecodeError as err:
                raise DataError(
                    f"{path}:{line_no}: not valid UTF-8 (byte {err.start}); expected UTF-8 JSON"
                ) from None
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}:{line_no}: invalid JSON ({err.msg} at column {err.colno})") from None
            problems.append(
                _row_to_problem(row, f"{path}:{line_no}", problem_field, answer_field, id_field, line_no)
            )
    return problems


def _load_parquet(path: Path, problem_field: str, answer_field: str, id_field: str) -> list[Problem]:
    try:
        import pyarrow.parquet as pq
    except ImportError as err:  # pragma: no cover - pyarrow comes with the datasets extra
        raise DataError(f"{path}: reading Parquet needs pyarrow (pip install 'tepo[hf-datasets]')") from err
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as err:
        raise DataError(f"{path}: not a readable Parquet file ({err})") from None
    return [
        _row_to_problem(row, f"{path}: row {i}", problem_field, answer_field, id_field, i)
        for i, row in enumerate(rows, start=1)
    ]


def _load_hub(
    name: str, split: str, problem_field: str, answer_field: str, id_field: str, subset: str | None = None
) -> list[Problem]:
    try:
        import datasets
    except ImportError as err:
        raise DataError(
            f"{name!r} is not a file, a procedural task ({', '.join(PROCEDURAL_TASKS)}) or loadable: "
            "loading Hugging Face datasets by name needs `pip install 'tepo[hf-datasets]'`"
        ) from err
    offline = (
        check_hub()
    )  # one quick probe: no route to the hub is said at once, not after a minute of retries
    try:
        rows = datasets.load_dataset(name, subset, split=split)
    except Exception as err:
        which = f"subset {subset!r}, split {split!r}" if subset else f"split {split!r}"
        why = f" ({offline_note(offline)})" if offline else ""
        raise DataError(
            f"{name!r} is not a file, a procedural task ({', '.join(PROCEDURAL_TASKS)}) "
            f"or a Hugging Face dataset that could be loaded ({which}; data.subset names a dataset's "
            f"configuration): {err}{why}"
        ) from None
    return [
        _row_to_problem(row, f"{name}[{split}] row {i}", problem_field, answer_field, id_field, i)
        for i, row in enumerate(rows, start=1)
    ]


def _row_to_problem(
    row, where: str, problem_field: str, answer_field: str, id_field: str, index: int
) -> Problem:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object with fields {problem_field!r} and {answer_field!r}")
    fields = {}
    for field in (problem_field, answer_field):
        if field not in row:
            raise DataError(
                f"{where}: missing field {field!r} (row has {sorted(row)}); "
                "map other names with data.problem_field / data.answer_field"
            )
        value = row[field]
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise DataError(
                f"{where}: field {field!r} must be a string or number, got {type(value).__name__}"
            )
        if isinstance(value, float) and not math.isfinite(value):  # JSON's NaN / Infinity extensions
            raise DataError(f"{where}: field {field!r} must be a finite number, got {value}")
        value = str(value).strip()
        if not value:
            raise DataError(f"{where}: field {field!r} is empty")
        fields[field] = value
    problem_id = str(row.get(id_field, index))
    source = row.get("data_source")
    return Problem(
        id=problem_id,
        problem=fields[problem_field],
        answer=fields[answer_field],
        data_source=source if isinstance(source, str) else "",
        extra_info=row_extra_info(row, (problem_field, answer_field, "data_source")),
    )


def row_extra_info(row: dict, used: tuple[str, ...]) -> dict:
    """A row's fields but ``used``, with its own ``extra_info`` mapping (verl's parquet layout) merged over
    them; a value that is not JSON (bytes, a date, an image...) becomes its ``str``, since reward functions
    run in worker processes that get JSON only."""
    extra = {str(k): v for k, v in row.items() if k not in used and k != "extra_info"}
    if isinstance(row.get("extra_info"), dict):
        extra.update({str(k): v for k, v in row["extra_info"].items()})
    elif "extra_info" in row:
        extra["extra_info"] = row["extra_info"]
    return {key: _json_value(value) for key, value in extra.items()}


def _json_value(value):
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return str(value)
    return value


def _with_source(problem: Problem, name: str) -> Problem:
    """``problem`` with ``data_source`` ``name`` unless its row gave its own."""
    return problem if problem.data_source else replace(problem, data_source=name)
