"""Hugging Face fallbacks without the hub: rows shaped like each dataset card's, through the real loading code.

The fixtures in ``tests/fixtures/hub/`` are hand-made rows with each card's column names (JSON types as the card's:
AMC23's answer is a float, OlympiadBench's final_answer a list). Parquet files are written here, at test time,
with the card's column types. Three paths are exercised:

- the benchmark fallback end to end: a directory laid out like the dataset's hub repository (files, and the
  README ``configs:`` block where the dataset has configs), found by ``datasets.load_dataset`` under the dataset's
  own id, so ``resolve_benchmark`` runs its real hub call with the real id, config and split;
- ``problems_from_hub_rows`` on the same rows read as Parquet and as JSONL (by ``datasets`` and by pyarrow);
- ``tepo.data.load_problems`` with a dataset name (the training data loader), the same way.

Also here: no path of the development machine in the installed package, and the message when the hub is
unreachable.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import tepo
from tepo.data import DataError, Problem, load_problems
from tepo.evaluate.benchmarks import (
    BENCHMARKS,
    DATA_DIR_ENV,
    describe_source,
    problem_from_hub_row,
    problems_from_hub_rows,
    resolve_benchmark,
)

FIXTURES = Path(__file__).parent / "fixtures" / "hub"

# The Problems each fixture must give: hand-derived from the rows, through each card's mapping.
EXPECTED: dict[str, list[Problem]] = {
    "math500": [
        Problem("test/prealgebra/9001.json", "What is $3 + 4 \\cdot 2$?", "11"),
        Problem("test/prealgebra/9002.json", "Write $\\frac{6}{8}$ in lowest terms.", "\\frac{3}{4}"),
    ],
    "aime24": [
        Problem("60", "Find the remainder when $2^{10}$ is divided by $1000$.", "24"),
        Problem("61", "How many positive divisors does $36$ have?", "9"),
    ],
    "aime25": [
        Problem("0", "Find the sum of all positive integers $n < 10$ with $n^2 < 20$.", "10"),
        Problem("1", "Compute $7 \\cdot 11 \\cdot 13$.", "1001"),
    ],
    "amc23": [
        Problem(
            "0",
            "Two trains start 90 miles apart and approach each other at 20 and 25 miles per hour. "
            "After how many hours do they meet?",
            "2",
        ),
        Problem("1", "What is $\\frac{1}{2} + \\frac{1}{4}$ as a decimal?", "0.75"),
        Problem("3", "How many primes are less than 20?", "8"),
    ],
    "minerva": [
        Problem("0", "A star has parallax $0.1$ arcseconds. What is its distance in parsecs?", "10"),
        Problem("1", "Compute the derivative of $x^3$ at $x = 2$.", "12"),
    ],
    "olympiadbench": [
        Problem("1606", "Find all real $x$ with $x^2 = 4$.", "$2$, $-2$"),
        Problem("1607", "A triangle has base 6 and height 4.\n\nWhat is the area of the triangle?", "12"),
    ],
    "omni_math": [
        Problem("0", "Find the minimum value of $x^2 - 6x + 12$ over all real $x$.", "3"),
        Problem("1", "Simplify $\\sqrt{50} + \\sqrt{8}$.", "7\\sqrt{2}"),
        Problem(
            "2",
            "For $n \\ge 2$, a path visits $n$ towns in a row. How many roads join neighbouring towns?",
            "n - 1",
        ),
    ],
    "gsm8k": [
        Problem("0", "Ana buys 3 packs of 4 pens. How many pens does she have?", "12"),
        Problem("1", "A shop sells 1,200 cups a day for 2 days. How many cups in all?", "2400"),
    ],
}


def _pa_schemas():
    """Column types of each card (``dataset_info.features``), for the Parquet copies of the fixtures."""
    import pyarrow as pa

    s, i, f, b = pa.string(), pa.int64(), pa.float64(), pa.bool_()
    return {
        "math500": {"problem": s, "solution": s, "answer": s, "subject": s, "level": i, "unique_id": s},
        "aime24": {"id": i, "problem": s, "solution": s, "answer": s, "url": s, "year": s},
        "aime25": {"problem": s, "answer": s, "id": s},
        "amc23": {"id": i, "question": s, "answer": f, "url": s},
        "minerva": {"question": s, "answer": s},
        "olympiadbench": {
            "id": i,
            "question": s,
            "solution": pa.list_(s),
            "final_answer": pa.list_(s),
            "context": s,
            "is_multiple_answer": b,
            "unit": s,
            "answer_type": s,
            "subfield": s,
        },
        "omni_math": {
            "domain": pa.list_(s),
            "difficulty": f,
            "problem": s,
            "solution": s,
            "answer": s,
            "source": s,
        },
        "gsm8k": {"question": s, "answer": s},
        "dapo_math_17k_processed": {
            "prompt": s,
            "solution": s,
            "data_source": s,
            "source_prompt": pa.list_(pa.struct([("content", s), ("role", s)])),
            "ability": s,
            "reward_model": pa.struct([("ground_truth", s), ("style", s)]),
            "extra_info": pa.struct([("index", s)]),
        },
    }


# How each dataset's hub repository is laid out: files (relative to the repository root) per (config, split),
# and whether the README declares configs. The layouts of the cards checked in benchmarks.py; where a card gave
# no file layout (minervamath, OlympiadBench), the one the hub's Parquet conversion writes.
REPO_LAYOUT = {
    "math500": {(None, "test"): "test.jsonl"},
    "aime24": {(None, "train"): "data/train-00000-of-00001.parquet"},
    "aime25": {(None, "test"): "test.jsonl"},
    "amc23": {(None, "test"): "test-00000-of-00001.parquet"},
    "minerva": {(None, "test"): "data/test-00000-of-00001.parquet"},
    "olympiadbench": {
        ("OE_TO_maths_en_COMP", "train"): "OE_TO_maths_en_COMP/train-00000-of-00001.parquet",
        ("OE_MM_maths_en_COMP", "train"): "OE_MM_maths_en_COMP/train-00000-of-00001.parquet",
    },
    "omni_math": {(None, "test"): "test.jsonl"},
    "gsm8k": {
        ("main", "test"): "main/test-00000-of-00001.parquet",
        ("main", "train"): "main/train-00000-of-00001.parquet",
        ("socratic", "test"): "socratic/test-00000-of-00001.parquet",
    },
}


def _rows(name: str) -> list[dict]:
    lines = (FIXTURES / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _write(rows: list[dict], path: Path, schema_name: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    types = _pa_schemas()[schema_name]
    assert set(types) == set(rows[0]), f"fixture {schema_name} columns differ from its card schema"
    schema = pa.schema([(col, typ) for col, typ in types.items()])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)


def _make_repo(root: Path, dataset: str, layout: dict, rows: list[dict], schema_name: str) -> None:
    """A directory ``root/<dataset id>`` laid out like the hub repository, with ``rows`` in every file."""
    repo = root / dataset
    for path in layout.values():
        _write(rows, repo / path, schema_name)
    configs = sorted({config for config, _ in layout if config is not None})
    if configs:
        lines = ["---", "configs:"]
        for config in configs:
            lines += [f"- config_name: {config}", "  data_files:"]
            for (c, split), path in sorted(layout.items()):
                if c == config:
                    lines += [f"  - split: {split}", f"    path: {path}"]
        (repo / "README.md").write_text("\n".join([*lines, "---", ""]), encoding="utf-8")


@pytest.fixture
def hub_sandbox(tmp_path, monkeypatch):
    """``datasets`` with its cache under tmp_path, offline, run from a directory holding repository copies."""
    datasets = pytest.importorskip("datasets", reason="the hf-datasets extra is not installed")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    repos = tmp_path / "repos"
    repos.mkdir()
    monkeypatch.chdir(repos)
    return repos


# --------------------------------------------------------------------------------------------------------------
# The benchmark fallback, end to end
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_benchmark_falls_back_to_its_hub_dataset(hub_sandbox, name):
    hub = BENCHMARKS[name].hub
    assert (hub.config, hub.split) in REPO_LAYOUT[name], "the layout must hold the split the loader asks for"
    _make_repo(hub_sandbox, hub.dataset, REPO_LAYOUT[name], _rows(name), name)
    assert describe_source(name) == f"hf:{hub.label()}"
    assert resolve_benchmark(name) == EXPECTED[name]
    # A data directory without this benchmark's file falls back the same way.
    empty = hub_sandbox.parent / "data"
    empty.mkdir()
    assert resolve_benchmark(name, empty) == EXPECTED[name]


def test_a_local_file_wins_over_the_hub(hub_sandbox):
    hub = BENCHMARKS["aime25"].hub
    _make_repo(hub_sandbox, hub.dataset, REPO_LAYOUT["aime25"], _rows("aime25"), "aime25")
    data = hub_sandbox.parent / "data"
    (data / "aime25").mkdir(parents=True)
    (data / "aime25" / "test.jsonl").write_text(
        json.dumps({"id": "x", "problem": "1+1?", "answer": "2"}) + "\n"
    )
    (problem,) = resolve_benchmark("aime25", data)
    assert (problem.id, problem.problem, problem.answer) == ("x", "1+1?", "2")
    assert problem.data_source == "test" and problem.extra_info == {
        "id": "x"
    }  # the file stem; the other fields


def test_omni_math_from_a_data_directory_holding_the_hub_file(tmp_path):
    # The hub's test.jsonl has 'problem' and 'answer', so it serves as the local file as it is (ids: line numbers).
    (tmp_path / "omni_math").mkdir()
    (tmp_path / "omni_math" / "test.jsonl").write_text(
        (FIXTURES / "omni_math.jsonl").read_text(encoding="utf-8"), encoding="utf-8"
    )
    assert describe_source("omni_math", tmp_path) == str((tmp_path / "omni_math" / "test.jsonl").resolve())
    problems = resolve_benchmark("omni_math", tmp_path)
    assert [(p.id, p.problem, p.answer) for p in problems] == [
        (str(i + 1), p.problem, p.answer) for i, p in enumerate(EXPECTED["omni_math"])
    ]


# Omni-MATH's answers are bare LaTeX (no $): shapes seen in the dataset's rows, each with a response's boxed answer
# and the verdict of the real verifier. Values and expressions are judged; labelled or prose answers match only
# when written alike (the limit of a rule-based checker, documented in benchmarks.py).
OMNI_MATH_SHAPES = [
    ("162\\sqrt{3}", "162\\sqrt3", "correct"),
    ("162\\sqrt{3}", "280.59", "wrong"),
    ("7\\sqrt{2}", "\\sqrt{98}", "correct"),
    ("n - 1", "-1+n", "correct"),
    ("n - 1", "n+1", "wrong"),
    ("2017^{98}", "2017^{98}", "correct"),
    ("\\frac{3^n}{n}", "3^n/n", "correct"),
    ("a^b > \\frac{3^n}{n}", "a^b>3^n/n", "correct"),
    (
        "4122 \\text{ (minimum)}, 6049 \\text{ (maximum)}",
        "4122 \\text{ (minimum)}, 6049 \\text{ (maximum)}",
        "correct",
    ),
    ("4122 \\text{ (minimum)}, 6049 \\text{ (maximum)}", "4122, 6049", "wrong"),
]


def test_omni_math_answer_shapes_through_the_verifier():
    from tepo.rewards import RewardPool

    golds = [gold for gold, _, _ in OMNI_MATH_SHAPES]
    responses = [f"So the answer is \\boxed{{{answer}}}." for _, answer, _ in OMNI_MATH_SHAPES]
    with RewardPool(num_workers=1, timeout_s=20.0, answer_format="boxed") as pool:
        results = pool.score(responses, golds)
    got = [(gold, answer, r.status) for (gold, answer, _), r in zip(OMNI_MATH_SHAPES, results, strict=True)]
    assert got == OMNI_MATH_SHAPES


# --------------------------------------------------------------------------------------------------------------
# Hub rows read from Parquet and JSONL, through problems_from_hub_rows
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["parquet", "json"])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_hub_rows_via_datasets(hub_sandbox, name, fmt):
    import datasets

    path = hub_sandbox / f"{name}.{'parquet' if fmt == 'parquet' else 'jsonl'}"
    _write(_rows(name), path, name)
    rows = datasets.load_dataset(fmt, data_files=str(path), split="train")
    assert problems_from_hub_rows(BENCHMARKS[name], rows) == EXPECTED[name]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_hub_rows_via_pyarrow(tmp_path, name):
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is not installed")
    path = tmp_path / f"{name}.parquet"
    _write(_rows(name), path, name)
    assert problems_from_hub_rows(BENCHMARKS[name], pq.read_table(path).to_pylist()) == EXPECTED[name]


def test_a_row_without_the_card_field_names_dataset_row_and_field():
    row = {"id": 0, "problem": "renamed column", "answer": 2.0, "url": "u"}
    with pytest.raises(
        DataError, match=r"math-ai/amc23/test row 4: missing or empty field 'question' \(fields"
    ):
        problem_from_hub_row(BENCHMARKS["amc23"].hub, row, 4)
    oly = BENCHMARKS["olympiadbench"].hub
    empty_list = {"id": 1, "question": "q", "final_answer": [], "context": None}
    with pytest.raises(
        DataError, match=r"Hothan/OlympiadBench\[OE_TO_maths_en_COMP\]/train row 0: .*'final_answer'"
    ):
        problem_from_hub_row(oly, empty_list, 0)
    with pytest.raises(DataError, match="'####'"):
        problem_from_hub_row(BENCHMARKS["gsm8k"].hub, {"question": "q", "answer": "no marker"}, 0)


def test_an_empty_split_is_refused():
    with pytest.raises(DataError, match=r"math-ai/minervamath/test is empty"):
        problems_from_hub_rows(BENCHMARKS["minerva"], [])


# --------------------------------------------------------------------------------------------------------------
# The training data loader with a dataset name
# --------------------------------------------------------------------------------------------------------------


@pytest.fixture
def training_hub(hub_sandbox, tmp_path, monkeypatch):
    """The repository copies of ``hub_sandbox``, reached by dataset id from another working directory.

    ``load_problems`` reads any existing path as a file before it tries a dataset name, so the copies cannot sit
    under the working directory as in the benchmark tests: ``datasets.load_dataset`` is pointed at them instead
    (only the location changes; the library's own loading, config and split handling run as they are).
    """
    import datasets

    real = datasets.load_dataset

    def load_dataset(path, *args, **kwargs):
        local = hub_sandbox / path
        return real(str(local) if local.is_dir() else path, *args, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return hub_sandbox


def test_training_loader_reads_a_hub_dataset_by_name(training_hub):
    hub_sandbox = training_hub
    _make_repo(hub_sandbox, "HuggingFaceH4/MATH-500", REPO_LAYOUT["math500"], _rows("math500"), "math500")
    problems = load_problems("HuggingFaceH4/MATH-500", split="test", id_field="unique_id")
    assert [(p.id, p.problem, p.answer) for p in problems] == [
        (p.id, p.problem, p.answer) for p in EXPECTED["math500"]
    ]
    assert {p.data_source for p in problems} == {
        "HuggingFaceH4/MATH-500"
    }  # a hub row's source: the dataset's name
    amc = "math-ai/amc23"
    _make_repo(hub_sandbox, amc, REPO_LAYOUT["amc23"], _rows("amc23"), "amc23")
    problems = load_problems(amc, split="test", problem_field="question", limit=2)
    # No answer transform here: a float answer is written as Python writes it (math-verify reads 2.0 as 2).
    assert [(p.id, p.answer) for p in problems] == [("0", "2.0"), ("1", "0.75")]
    with pytest.raises(DataError, match=r"'math-ai/amc23'.*split 'train'"):
        load_problems(amc, split="train", problem_field="question")


def test_training_loader_names_a_dataset_that_needs_a_config(training_hub):
    hub_sandbox = training_hub
    # load_problems passes no config name, so a dataset with several configs (gsm8k: main, socratic) is refused
    # with the library's message, naming the dataset and the configs to choose from.
    _make_repo(hub_sandbox, "openai/gsm8k", REPO_LAYOUT["gsm8k"], _rows("gsm8k"), "gsm8k")
    with pytest.raises(DataError, match=r"(?s)'openai/gsm8k'.*split 'test'.*'main', 'socratic'"):
        load_problems("openai/gsm8k", split="test", problem_field="question")


def test_the_paper_config_data_source_loads(training_hub):
    """The paper preset's training set: open-r1/DAPO-Math-17k-Processed, subset en (the card's configs all/en/cn,
    one train split each; prompt and solution are flat strings there, unlike BytedTsinghua-SIA/DAPO-Math-17k's
    chat-message prompt and reward_model.ground_truth)."""
    hub_sandbox = training_hub
    import yaml

    config = yaml.safe_load((Path(tepo.__file__).parent / "configs" / "tepo_paper_qwen7b.yaml").read_text())
    data = config["data"]
    assert (data["source"], data["subset"]) == ("open-r1/DAPO-Math-17k-Processed", "en")
    layout = {(name, "train"): f"{name}/train-00000-of-00001.parquet" for name in ("all", "en", "cn")}
    rows = _rows("dapo_math_17k_processed")
    _make_repo(hub_sandbox, data["source"], layout, rows, "dapo_math_17k_processed")
    problems = load_problems(
        data["source"],
        subset=data["subset"],
        split="train",
        problem_field=data["problem_field"],
        answer_field=data["answer_field"],
    )
    assert [(p.problem, p.answer) for p in problems] == [(r["prompt"], r["solution"]) for r in rows]
    with pytest.raises(DataError, match=r"subset 'fr', split 'train'"):
        load_problems(data["source"], subset="fr", problem_field="prompt", answer_field="solution")


# --------------------------------------------------------------------------------------------------------------
# No hub, no data directory: one clear message; no machine paths in the package
# --------------------------------------------------------------------------------------------------------------


def test_unreachable_hub_gives_one_message_naming_the_ways_out(tmp_path):
    pytest.importorskip("datasets", reason="the hf-datasets extra is not installed")
    import socket

    with socket.socket() as closed:  # the hub at a closed port: unreachable with or without a network
        closed.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{closed.getsockname()[1]}"
    offline_variables = (DATA_DIR_ENV, "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
    env = {k: v for k, v in os.environ.items() if k not in offline_variables}
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf-home"))  # nothing cached, no offline setting
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tepo.cli",
            "eval",
            "--bench",
            "aime25",
            "--output-dir",
            str(tmp_path / "out"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    message = done.stderr
    assert "no data directory given for benchmark 'aime25'" in message
    assert "hub could not be reached to load math-ai/aime25/test" in message
    assert "--data-dir" in message and "$TEPO_DATA_DIR" in message and "aime25/test.jsonl" in message
    # One probe found the hub unreachable (tepo.hub): said at once, without the hub client's 26 s of retries.
    assert f"the Hugging Face hub ({endpoint}) did not answer a probe" in message
    assert "Traceback" not in message and "Retrying" not in message
    assert not (tmp_path / "out" / "results.json").exists()


# Paths of the machine the project is developed on, in any spelling seen so far.
# The directory this checkout lies in (the development machine's work area), and the shared folder beside it.
_MACHINE_PATH = re.compile(
    re.escape(str(Path(__file__).resolve().parents[2]))
    + "/"
    + r"|\.\./shared\b|\bshared/(data|papers)\b|ALGORITHMS\.md|ARCHITECTURE\.md"
)


def test_package_source_names_no_machine_path():
    package = Path(tepo.__file__).resolve().parent
    hits = []
    for path in sorted(package.rglob("*")):
        if path.suffix not in {".py", ".yaml", ".yml", ".json", ".md", ".txt", ".toml", ".cfg"}:
            continue
        for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if _MACHINE_PATH.search(line):
                hits.append(f"{path.relative_to(package.parent)}:{line_no}: {line.strip()}")
    assert not hits, "paths of the development machine in the package:\n" + "\n".join(hits)


def test_a_hub_dataset_without_the_split_is_one_message_not_an_unreachable_hub(hub_sandbox):
    # A repository copy with only a train split: the library's own error, passed on with the ways out.
    _make_repo(hub_sandbox, "math-ai/aime25", {(None, "train"): "train.jsonl"}, _rows("aime25"), "aime25")
    with pytest.raises(DataError) as caught:
        resolve_benchmark("aime25")
    message = str(caught.value)
    assert "the Hugging Face dataset math-ai/aime25/test could not be loaded" in message
    assert "test" in message.split("could not be loaded", 1)[1] and "--data-dir" in message
    assert "could not be reached" not in message


def test_unreachable_is_read_from_the_error_and_its_causes():
    from tepo.evaluate.benchmarks import _hub_unreachable

    assert _hub_unreachable(ConnectionError("Couldn't reach 'x' on the Hub (OfflineModeIsEnabled)"))
    try:
        try:
            raise TimeoutError("read timed out")
        except TimeoutError as inner:
            raise RuntimeError("download failed") from inner
    except RuntimeError as outer:
        assert _hub_unreachable(outer)
    assert not _hub_unreachable(ValueError("Config name is missing."))


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation other than - and _ dropped, spaces to -."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_the_package_cites_sections_that_exist_in_docs_algorithms():
    doc = Path(__file__).resolve().parents[1] / "docs" / "algorithms.md"
    headings = re.findall(r"^#+ (.+)$", doc.read_text(encoding="utf-8"), flags=re.MULTILINE)
    anchors = {_anchor(h) for h in headings}
    assert {"aggregation", "regularizers", "erpo", "cov_gauss", "rollout-correction-off-policy"} <= anchors
    package = Path(tepo.__file__).resolve().parent
    cited = {
        (path.name, anchor)
        for path in package.rglob("*.py")
        for anchor in re.findall(r"docs/algorithms\.md#([\w\-]+)", path.read_text(encoding="utf-8"))
    }
    assert cited, "the package cites no section of docs/algorithms.md"
    missing = sorted(c for c in cited if c[1] not in anchors)
    assert not missing, f"citations of sections docs/algorithms.md does not have: {missing}"
