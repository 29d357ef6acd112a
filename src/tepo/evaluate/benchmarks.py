"""Math benchmarks by name: a local data directory first, a Hugging Face dataset as the fallback, or any JSONL.

Names and where they come from (``<data-dir>/<dir>/test.jsonl``, rows with ``id``, ``problem``, ``answer``; the
shared copies are described in ``shared/data/MANIFEST.md``):

=============  ================  =====  ===============================================================
name           local dir         rows   Hugging Face fallback (dataset, config, split, fields)
=============  ================  =====  ===============================================================
math500        math500           500    HuggingFaceH4/MATH-500, test, problem / answer
aime24         aime24             30    HuggingFaceH4/aime_2024, train, problem / answer
aime25         aime25             30    math-ai/aime25, test, problem / answer
amc23          amc23              40    math-ai/amc23, test, question / answer ("27.0" -> "27")
minerva        minerva_math      272    math-ai/minervamath, test, question / answer
olympiadbench  olympiadbench     675    Hothan/OlympiadBench, OE_TO_maths_en_COMP, train, question /
                                        final_answer (a list, joined with ", " as the local copy is)
gsm8k          gsm8k            1319    openai/gsm8k, main, test, question / answer after "####", commas removed
=============  ================  =====  ===============================================================

The data directory is, in order: the ``data_dir`` argument, ``$TEPO_DATA_DIR``, ``../shared/data`` relative to the
working directory, ``/work/shared/data``. The hub fallback is used only when the local file is absent and needs
``pip install 'tepo[hf-datasets]'`` and a reachable hub (or a warm cache); its dataset names and fields were taken
from the dataset cards and have not been exercised offline here. Anything that is not a benchmark name is read as a
JSONL/Parquet path with ``problem`` and ``answer`` fields (``tepo.data.load_problems``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tepo.data import DataError, Problem, load_problems

DATA_DIR_ENV = "TEPO_DATA_DIR"
_DEFAULT_DATA_DIRS = (Path("..") / "shared" / "data", Path("/work/shared/data"))


@dataclass(frozen=True)
class HubSource:
    """Where a benchmark lives on the Hugging Face hub and how a row becomes a ``Problem``."""

    dataset: str
    split: str
    problem_field: str
    answer_field: str
    config: str | None = None
    id_field: str | None = None
    answer_transform: Callable[[object], str] | None = None


@dataclass(frozen=True)
class Benchmark:
    name: str
    local_dir: str  # under the data directory, holding test.jsonl
    title: str
    hub: HubSource
    sampled_in_tepo: bool  # the TEPO paper reports it as avg@32 at temperature 0.6 (else greedy)


def gsm8k_final_answer(solution: object) -> str:
    """GSM8K's answer field is a worked solution ending in ``#### 1,234``: the number after ``####``, no commas."""
    text = str(solution)
    if "####" not in text:
        raise DataError(f"GSM8K answer {text[:80]!r} has no '####' final-answer marker")
    return text.rsplit("####", 1)[1].strip().replace(",", "")


def _float_integer(value: object) -> str:
    """AMC23 on the hub stores answers as floats (27.0): write integers without the ``.0``."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    text = str(value).strip()
    return text[:-2] if text.endswith(".0") and text[:-2].lstrip("-").isdigit() else text


def _join_answers(value: object) -> str:
    """OlympiadBench's ``final_answer`` is a list (several answers for some problems): join with ", "."""
    if isinstance(value, list | tuple):
        return ", ".join(str(v).strip() for v in value)
    return str(value)


BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark(
            "math500",
            "math500",
            "MATH-500",
            HubSource("HuggingFaceH4/MATH-500", "test", "problem", "answer", id_field="unique_id"),
            False,
        ),
        Benchmark(
            "aime24",
            "aime24",
            "AIME 2024",
            HubSource("HuggingFaceH4/aime_2024", "train", "problem", "answer", id_field="id"),
            True,
        ),
        Benchmark(
            "aime25",
            "aime25",
            "AIME 2025",
            HubSource("math-ai/aime25", "test", "problem", "answer", id_field="id"),
            True,
        ),
        Benchmark(
            "amc23",
            "amc23",
            "AMC 2023",
            HubSource("math-ai/amc23", "test", "question", "answer", answer_transform=_float_integer),
            True,
        ),
        Benchmark(
            "minerva",
            "minerva_math",
            "Minerva Math",
            HubSource("math-ai/minervamath", "test", "question", "answer"),
            False,
        ),
        Benchmark(
            "olympiadbench",
            "olympiadbench",
            "OlympiadBench (OE_TO_maths_en_COMP)",
            HubSource(
                "Hothan/OlympiadBench",
                "train",
                "question",
                "final_answer",
                config="OE_TO_maths_en_COMP",
                id_field="id",
                answer_transform=_join_answers,
            ),
            False,
        ),
        Benchmark(
            "gsm8k",
            "gsm8k",
            "GSM8K",
            HubSource(
                "openai/gsm8k",
                "test",
                "question",
                "answer",
                config="main",
                answer_transform=gsm8k_final_answer,
            ),
            False,
        ),
    )
}


def benchmark_names() -> list[str]:
    return list(BENCHMARKS)


def default_data_dir() -> Path | None:
    """``$TEPO_DATA_DIR`` if set, else the first of ``../shared/data`` (from the CWD), ``/work/shared/data`` that
    exists, else None (benchmarks then come from the hub)."""
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise DataError(
                f"${DATA_DIR_ENV}={env!r} is not a directory; expected a directory like shared/data"
            )
        return path
    for candidate in _DEFAULT_DATA_DIRS:
        if candidate.is_dir():
            return candidate.resolve()
    return None


def benchmark_path(name: str, data_dir: str | os.PathLike | None = None) -> Path | None:
    """The local file of benchmark ``name`` (``<data_dir>/<dir>/test.jsonl``), or None if there is none."""
    bench = BENCHMARKS[name]
    root = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
    if data_dir is not None and not root.is_dir():
        raise DataError(
            f"data directory {str(data_dir)!r} does not exist; expected a directory like shared/data"
        )
    if root is None:
        return None
    path = root / bench.local_dir / "test.jsonl"
    return path if path.is_file() else None


def describe_source(name_or_path: str, data_dir: str | os.PathLike | None = None) -> str:
    """Where ``resolve_benchmark`` reads this benchmark from (a path or ``hf:dataset[config]/split``)."""
    if name_or_path in BENCHMARKS:
        path = benchmark_path(name_or_path, data_dir)
        if path is not None:
            return str(path.resolve())
        hub = BENCHMARKS[name_or_path].hub
        return f"hf:{hub.dataset}" + (f"[{hub.config}]" if hub.config else "") + f"/{hub.split}"
    return str(Path(name_or_path).expanduser().resolve())


def resolve_benchmark(name_or_path: str, data_dir: str | os.PathLike | None = None) -> list[Problem]:
    """The problems of a benchmark name (see the module table) or of a JSONL/Parquet file path.

    A name reads ``<data_dir>/<dir>/test.jsonl`` (``data_dir`` default: :func:`default_data_dir`) and falls back to
    the Hugging Face dataset when that file is missing. A path needs ``problem`` and ``answer`` fields (``id``
    optional). Raises ``DataError`` naming the benchmark, file, line and field on bad input.
    """
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise DataError(
            f"benchmark must be a name ({', '.join(BENCHMARKS)}) or a JSONL path, got {name_or_path!r}"
        )
    name_or_path = name_or_path.strip()
    if name_or_path in BENCHMARKS:
        path = benchmark_path(name_or_path, data_dir)
        if path is not None:
            return load_problems(str(path))
        return _load_from_hub(BENCHMARKS[name_or_path], data_dir)
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return load_problems(str(path))
    if path.is_dir() and (path / "test.jsonl").is_file():
        return load_problems(str(path / "test.jsonl"))
    raise DataError(
        f"benchmark {name_or_path!r} is neither a known name ({', '.join(BENCHMARKS)}) nor an existing "
        "JSONL/Parquet file with 'problem' and 'answer' fields"
    )


def _load_from_hub(bench: Benchmark, data_dir) -> list[Problem]:
    hub = bench.hub
    where = (
        f"no local file for benchmark {bench.name!r} "
        f"(looked for <data-dir>/{bench.local_dir}/test.jsonl with data dir "
        f"{str(data_dir) if data_dir is not None else default_data_dir()}; set --data-dir or ${DATA_DIR_ENV})"
    )
    try:
        import datasets
    except ImportError as err:
        raise DataError(
            f"{where}, and loading {hub.dataset} from the Hugging Face hub needs `pip install 'tepo[hf-datasets]'`"
        ) from err
    try:
        rows = datasets.load_dataset(hub.dataset, hub.config, split=hub.split)
    except Exception as err:
        raise DataError(
            f"{where}, and the Hugging Face dataset {hub.dataset} could not be loaded: {err}"
        ) from None
    problems = []
    for i, row in enumerate(rows):
        label = f"{hub.dataset}[{hub.split}] row {i}"
        for field in (hub.problem_field, hub.answer_field):
            if row.get(field) in (None, ""):
                raise DataError(f"{label}: missing or empty field {field!r}")
        raw_answer = row[hub.answer_field]
        answer = hub.answer_transform(raw_answer) if hub.answer_transform else str(raw_answer)
        problem_id = str(row[hub.id_field]) if hub.id_field and row.get(hub.id_field) is not None else str(i)
        problems.append(
            Problem(id=problem_id, problem=str(row[hub.problem_field]).strip(), answer=answer.strip())
        )
    if not problems:
        raise DataError(f"{hub.dataset}[{hub.split}] is empty")
    return problems
