"""Math benchmarks by name: a local data directory first, a Hugging Face dataset as the fallback, or any JSONL.

Names and where they come from (``<data-dir>/<dir>/test.jsonl``, rows with ``id``, ``problem``, ``answer``):

=============  ================  =====  ===============================================================
name           local dir         rows   Hugging Face fallback (dataset, config, split, fields)
=============  ================  =====  ===============================================================
math500        math500           500    HuggingFaceH4/MATH-500, test, problem / answer (id: unique_id)
aime24         aime24             30    HuggingFaceH4/aime_2024, train, problem / answer (id: id)
aime25         aime25             30    math-ai/aime25, test, problem / answer (id: id)
amc23          amc23              40    math-ai/amc23, test, question / answer (a float: 27.0 -> "27")
minerva        minerva_math      272    math-ai/minervamath, test, question / answer
olympiadbench  olympiadbench     675    Hothan/OlympiadBench, OE_TO_maths_en_COMP, train, question /
                                        final_answer (a list, joined with ", " as the local copy is);
                                        674 rows on the hub
omni_math      omni_math        4428    KbsdJames/Omni-MATH, test, problem / answer (a LaTeX expression)
gsm8k          gsm8k            1319    openai/gsm8k, main, test, question / answer after "####", commas removed
=============  ================  =====  ===============================================================

The data directory is the ``data_dir`` argument (``tepo eval --data-dir``), else ``$TEPO_DATA_DIR``; nothing else is
searched. A benchmark whose local file is absent (or with no data directory at all) is loaded from the Hugging Face
hub, which needs ``pip install 'tepo[hf-datasets]'`` and a reachable hub (or a warm cache); an unreachable hub is one
``DataError`` saying so and naming ``--data-dir`` / ``$TEPO_DATA_DIR``. Each hub row becomes a ``Problem`` through
:func:`problem_from_hub_row`, which the tests run on hand-made rows shaped like each dataset card's (no hub access
here). Anything that is not a benchmark name is read as a JSONL/Parquet path with ``problem`` and ``answer`` fields
(``tepo.data.load_problems``).

Omni-MATH (Gao et al. 2024, arXiv 2410.07985) is used whole, all 4,428 problems: the TEPO paper reports
"OMNI-MATH" without naming a subset, and we found no 500-problem subset in common use among the papers that report
it (a 500-row sample is on the hub, ``reliable-agents/Omni-MATH-500``, but we found no paper that names it; the
Omni-MATH authors' own reduced set is "Omni-MATH-Rule", the problems a rule-based checker can judge). Its answers
are LaTeX without ``$`` delimiters (``162\\sqrt{3}``, ``n - 1``, ``2017^{98}``); math-verify judges the
expressions and values among them; answers that are prose or several labelled values
(``4122 \\text{ (minimum)}, 6049 \\text{ (maximum)}``) match only when written alike, which is why the
Omni-MATH authors grade with a model judge instead. The hub file (``test.jsonl``, with ``problem`` and ``answer``)
can serve as the local file as it is.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tepo.data import DataError, Problem, load_problems
from tepo.hub import check_hub, offline_note

DATA_DIR_ENV = "TEPO_DATA_DIR"


@dataclass(frozen=True)
class HubSource:
    """Where a benchmark lives on the Hugging Face hub and how a row becomes a ``Problem``.

    ``context_field``: a field whose text, when present and non-empty, precedes the problem (OlympiadBench keeps
    shared premises there).
    """

    dataset: str
    split: str
    problem_field: str
    answer_field: str
    config: str | None = None
    id_field: str | None = None
    answer_transform: Callable[[object], str] | None = None
    context_field: str | None = None

    def label(self) -> str:
        return f"{self.dataset}" + (f"[{self.config}]" if self.config else "") + f"/{self.split}"


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


# Each hub source below was checked against public evidence of the dataset's card and files (no hub access from
# here, so no row was downloaded); the comment beside each records what was checked. Row counts of the hub copies
# can differ from the local files (OlympiadBench: 674 on the hub, 675 in the local copy).
BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark(
            "math500",
            "math500",
            "MATH-500",
            # HuggingFaceH4/MATH-500: no config (default), one split "test" (file test.jsonl, 500 rows); fields
            # problem, solution, answer, subject (str), level (int), unique_id (str, "test/precalculus/807.json").
            HubSource("HuggingFaceH4/MATH-500", "test", "problem", "answer", id_field="unique_id"),
            False,
        ),
        Benchmark(
            "aime24",
            "aime24",
            "AIME 2024",
            # HuggingFaceH4/aime_2024: default config, one split "train" (data/train-00000-of-00001.parquet, 30
            # rows); fields id (int), problem, solution, answer (str), url, year.
            HubSource("HuggingFaceH4/aime_2024", "train", "problem", "answer", id_field="id"),
            True,
        ),
        Benchmark(
            "aime25",
            "aime25",
            "AIME 2025",
            # math-ai/aime25: default config, one split "test" (file test.jsonl, 30 rows); fields id, problem, answer
            # (the answer's type is not pinned down by the evidence: str() handles a string or an int).
            HubSource("math-ai/aime25", "test", "problem", "answer", id_field="id"),
            True,
        ),
        Benchmark(
            "amc23",
            "amc23",
            "AMC 2023",
            # math-ai/amc23: default config, one split "test" (test-00000-of-00001.parquet, 40 rows); fields id (int),
            # question (str), answer (float64: 27.0), url (str). The problem is in "question", not "problem".
            HubSource(
                "math-ai/amc23", "test", "question", "answer", id_field="id", answer_transform=_float_integer
            ),
            True,
        ),
        Benchmark(
            "minerva",
            "minerva_math",
            "Minerva Math",
            # math-ai/minervamath: default config, one split "test" (272 rows); fields question (str), answer (str,
            # the final answer, not a worked solution). No id field: the row index is the id.
            HubSource("math-ai/minervamath", "test", "question", "answer"),
            False,
        ),
        Benchmark(
            "olympiadbench",
            "olympiadbench",
            "OlympiadBench (OE_TO_maths_en_COMP)",
            # Hothan/OlympiadBench: config "OE_TO_maths_en_COMP" (text-only, open-ended, English competition math;
            # 674 rows), one split "train"; fields id (int), question (str), final_answer (list of str), context
            # (str or null), solution (list of str), is_multiple_answer (bool), unit, answer_type, subfield, ...
            HubSource(
                "Hothan/OlympiadBench",
                "train",
                "question",
                "final_answer",
                config="OE_TO_maths_en_COMP",
                id_field="id",
                answer_transform=_join_answers,
                context_field="context",
            ),
            False,
        ),
        Benchmark(
            "omni_math",
            "omni_math",
            "Omni-MATH",
            # KbsdJames/Omni-MATH: no config (default), one file test.jsonl at the repository root (7.5 MB), so one
            # split "test" (4428 rows); fields domain (list of str), difficulty (float), problem (str), solution
            # (str), answer (str, LaTeX without $), source (str). No id field: the row index is the id.
            HubSource("KbsdJames/Omni-MATH", "test", "problem", "answer"),
            False,
        ),
        Benchmark(
            "gsm8k",
            "gsm8k",
            "GSM8K",
            # openai/gsm8k: configs "main" and "socratic" (a config is required), splits train/test (test: 1319
            # rows); fields question (str), answer (str, a worked solution ending in "#### <number>"). No id field.
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
    """``$TEPO_DATA_DIR`` if set (it must be a directory), else None: benchmarks then come from the hub."""
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise DataError(
                f"${DATA_DIR_ENV}={env!r} is not a directory; expected a directory holding <benchmark>/test.jsonl"
            )
        return path
    return None


def benchmark_path(name: str, data_dir: str | os.PathLike | None = None) -> Path | None:
    """The local file of benchmark ``name`` (``<data_dir>/<dir>/test.jsonl``), or None if there is none."""
    bench = BENCHMARKS[name]
    if data_dir is not None:
        root = Path(data_dir).expanduser()
        if not root.is_dir():
            raise DataError(
                f"data directory {str(data_dir)!r} does not exist; expected a directory holding "
                "<benchmark>/test.jsonl"
            )
    else:
        root = default_data_dir()
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
        return f"hf:{BENCHMARKS[name_or_path].hub.label()}"
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


def problem_from_hub_row(hub: HubSource, row: dict, index: int) -> Problem:
    """One hub row as a ``Problem``: the problem field (after the context field, when that is non-empty), the
    answer field through the source's transform, the id field or else the row index. ``DataError`` names the
    dataset, row and field when a field is missing or empty."""
    label = f"{hub.label()} row {index}"
    if not isinstance(row, dict):
        raise DataError(f"{label}: expected a row with fields {hub.problem_field!r} and {hub.answer_field!r}")
    for field in (hub.problem_field, hub.answer_field):
        value = row.get(field)
        if value is None or (isinstance(value, str | list | tuple) and len(value) == 0):
            present = ", ".join(sorted(map(str, row))) or "none"
            raise DataError(f"{label}: missing or empty field {field!r} (fields present: {present})")
    raw_answer = row[hub.answer_field]
    answer = (hub.answer_transform(raw_answer) if hub.answer_transform else str(raw_answer)).strip()
    if not answer:
        raise DataError(f"{label}: field {hub.answer_field!r} gives an empty answer ({raw_answer!r})")
    problem = str(row[hub.problem_field]).strip()
    context = row.get(hub.context_field) if hub.context_field else None
    if isinstance(context, str) and context.strip():
        problem = f"{context.strip()}\n\n{problem}"
    problem_id = row.get(hub.id_field) if hub.id_field else None
    return Problem(
        id=str(problem_id) if problem_id is not None else str(index), problem=problem, answer=answer
    )


def problems_from_hub_rows(bench: Benchmark, rows) -> list[Problem]:
    """Every row of a loaded hub split (any iterable of dicts, e.g. a ``datasets.Dataset``) as ``Problem``s."""
    problems = [problem_from_hub_row(bench.hub, row, i) for i, row in enumerate(rows)]
    if not problems:
        raise DataError(f"{bench.hub.label()} is empty")
    return problems


_UNREACHABLE_ERRORS = frozenset(
    {"ConnectionError", "ConnectError", "ConnectTimeout", "ReadTimeout", "Timeout", "TimeoutError"}
)


def _hub_unreachable(err: BaseException) -> bool:
    """Whether loading failed for want of the hub: datasets raises ConnectionError ("Couldn't reach ...") when the
    hub is offline and nothing is cached; the HTTP clients underneath raise their own connect/timeout errors."""
    seen: BaseException | None = err
    for _ in range(5):  # the error and the causes it chains
        if seen is None:
            break
        if _UNREACHABLE_ERRORS & {cls.__name__ for cls in type(seen).__mro__}:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _load_from_hub(bench: Benchmark, data_dir) -> list[Problem]:
    hub = bench.hub
    if data_dir is None and default_data_dir() is None:
        where = f"no data directory given for benchmark {bench.name!r} (--data-dir or ${DATA_DIR_ENV})"
    else:
        root = data_dir if data_dir is not None else default_data_dir()
        where = f"no local file for benchmark {bench.name!r} ({Path(root) / bench.local_dir / 'test.jsonl'})"
    local_hint = (
        f"pass --data-dir DIR (or set ${DATA_DIR_ENV}=DIR) with DIR/{bench.local_dir}/test.jsonl holding rows "
        "with 'problem' and 'answer'"
    )
    try:
        import datasets
    except ImportError as err:
        raise DataError(
            f"{where}, and loading {hub.dataset} from the Hugging Face hub needs "
            f"`pip install 'tepo[hf-datasets]'`; or {local_hint}"
        ) from err
    offline = (
        check_hub()
    )  # one quick probe: no route to the hub is said at once, not after a minute of retries
    try:
        rows = datasets.load_dataset(hub.dataset, hub.config, split=hub.split)
    except Exception as err:
        if _hub_unreachable(err):
            why = f"; {offline_note(offline)}" if offline else ""
            raise DataError(
                f"{where}, and the Hugging Face hub could not be reached to load {hub.label()} ({err}{why}); "
                f"{local_hint}, or retry with network access (a loaded dataset is cached for offline use)"
            ) from None
        raise DataError(
            f"{where}, and the Hugging Face dataset {hub.label()} could not be loaded "
            f"({type(err).__name__}: {err}); {local_hint}"
        ) from None
    return problems_from_hub_rows(bench, rows)
