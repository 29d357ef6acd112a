"""Problems with verifiable answers: loading from files or the Hugging Face hub, procedural tasks, prompts.

A `Problem` is the only thing the rest of the pipeline sees: an id, the problem text and the gold answer as a
string (math-verify parses it later). Sources:

- a JSONL or Parquet path (a data directory's ``gsm8k/train.jsonl`` works as it is),
- a Hugging Face dataset name (``openai/gsm8k``; needs the ``hf-datasets`` extra and a reachable hub or cache),
- a procedural task name: ``arithmetic`` (the embedded default: single-digit addition and multiplication as short
  word problems), ``arithmetic-multistep`` (two-digit, two-step problems, where the embedded model starts near 0)
  or ``arithmetic-mix`` (equal shares of three levels: the default comparison task, ``tepo.compare.tasks``).

Bad input fails before any model is loaded, with one message naming the file, the line and the field.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

PROCEDURAL_TASKS = ("arithmetic", "arithmetic-multistep", "arithmetic-mix")

DEFAULT_INSTRUCTION = "Answer with the final number in \\boxed{}."


class DataError(ValueError):
    """Bad input data: the message names the file, line and field."""


@dataclass(frozen=True)
class Problem:
    id: str
    problem: str
    answer: str


# --------------------------------------------------------------------------------------------------------------
# Loading from files and the hub
# --------------------------------------------------------------------------------------------------------------


def load_problems(
    source: str,
    *,
    problem_field: str = "problem",
    answer_field: str = "answer",
    id_field: str = "id",
    split: str = "train",
    limit: int | None = None,
    seed: int = 0,
) -> list[Problem]:
    """Load problems from a procedural task name, a JSONL/Parquet path, or a Hugging Face dataset name.

    For procedural tasks ``split`` selects disjoint problem streams (``train`` vs ``test``) and ``limit`` how
    many to make (default 1,000). For files, every row must have a non-empty ``problem_field`` and
    ``answer_field`` (numbers are accepted for the answer and turned into strings).
    """
    if source == "arithmetic-mix":
        from tepo.compare.tasks import make_mixture_problems  # the comparison task: a graded mixture

        return make_mixture_problems(limit or 1000, split=split, seed=seed)
    if source in PROCEDURAL_TASKS:
        return make_arithmetic_problems(source, limit or 1000, split=split, seed=seed)
    path = Path(source).expanduser()
    if path.exists() or source.endswith((".jsonl", ".json", ".parquet")):
        problems = _load_file(path, problem_field, answer_field, id_field)
    else:
        problems = _load_hub(source, split, problem_field, answer_field, id_field)
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


def _load_hub(name: str, split: str, problem_field: str, answer_field: str, id_field: str) -> list[Problem]:
    try:
        import datasets
    except ImportError as err:
        raise DataError(
            f"{name!r} is not a file, a procedural task ({', '.join(PROCEDURAL_TASKS)}) or loadable: "
            "loading Hugging Face datasets by name needs `pip install 'tepo[hf-datasets]'`"
        ) from err
    try:
        rows = datasets.load_dataset(name, split=split)
    except Exception as err:
        raise DataError(
            f"{name!r} is not a file, a procedural task ({', '.join(PROCEDURAL_TASKS)}) "
            f"or a Hugging Face dataset that could be loaded (split {split!r}): {err}"
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
    return Problem(id=problem_id, problem=fields[problem_field], answer=fields[answer_field])


# --------------------------------------------------------------------------------------------------------------
# Procedural arithmetic
# --------------------------------------------------------------------------------------------------------------

_NAMES = ("Tom", "Mia", "Sam", "Ana", "Leo", "Zoe", "Ben", "Ivy", "Max", "Eva", "Raj", "Kim")
_THINGS = (
    "apples",
    "pencils",
    "marbles",
    "books",
    "cookies",
    "stickers",
    "shells",
    "cards",
    "coins",
    "stamps",
)
_BOXES = ("boxes", "bags", "baskets", "jars", "packs", "rows")


def _single_step(rng: random.Random) -> tuple[str, int]:
    name, thing, box = rng.choice(_NAMES), rng.choice(_THINGS), rng.choice(_BOXES)
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    if rng.random() < 0.5:
        return f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?", a + b
    return (
        f"{name} has {a} {box} with {b} {thing} in each. How many {thing} does {name} have in total?",
        a * b,
    )


def _multi_step(rng: random.Random) -> tuple[str, int]:
    name, thing, box = rng.choice(_NAMES), rng.choice(_THINGS), rng.choice(_BOXES)
    kind = rng.randrange(3)
    if kind == 0:
        a, b, c = rng.randint(2, 9), rng.randint(11, 19), rng.randint(3, 20)
        text = (
            f"{name} has {a} {box} with {b} {thing} in each and gives away {c} {thing}. "
            f"How many {thing} does {name} have left?"
        )
        return text, a * b - c
    if kind == 1:
        a, b, c = rng.randint(12, 60), rng.randint(12, 40), rng.randint(2, 9)
        text = f"{name} had {a} {thing}, found {b} more, then bought {c} {box} of 10. How many {thing} now?"
        return text, a + b + 10 * c
    a, b = rng.randint(12, 49), rng.randint(12, 49)
    text = (
        f"{name} has {a} {thing}. A friend has {b} more than {name}. How many {thing} do they have together?"
    )
    return text, a + (a + b)


def make_arithmetic_problems(task: str, count: int, *, split: str = "train", seed: int = 0) -> list[Problem]:
    """Deterministic procedural problems; ``train`` and ``test`` streams never share a problem text."""
    make = _single_step if task == "arithmetic" else _multi_step
    # Split streams by seed offset, then remove from train anything that test could produce first: a held-out
    # problem must not also be a training problem.
    rng = random.Random(f"{task}:{split}:{seed}")
    other = set()
    if split != "test":
        other_rng = random.Random(f"{task}:test:{seed}")
        other = {make(other_rng)[0] for _ in range(max(count, 200))}
    problems, seen = [], set()
    attempts = 0
    while len(problems) < count:
        attempts += 1
        if attempts > 100 * count + 1000:
            break  # the single-step space is finite (~2,600 texts): return what exists rather than spin
        text, answer = make(rng)
        if text in seen or text in other:
            continue
        seen.add(text)
        problems.append(Problem(id=f"{task}-{split}-{len(problems)}", problem=text, answer=str(answer)))
    return problems


# --------------------------------------------------------------------------------------------------------------
# Prompts and the training stream
# --------------------------------------------------------------------------------------------------------------


def build_prompt_ids(
    tokenizer, problems: Sequence[Problem], instruction: str = DEFAULT_INSTRUCTION
) -> list[list[int]]:
    """Chat-format each problem (user turn: problem + instruction) and tokenize, ready for the rollout."""
    out = []
    for problem in problems:
        content = f"{problem.problem} {instruction}".strip()
        messages = [{"role": "user", "content": content}]
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        else:
            text = content + "\n"
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


class PromptStream:
    """An endless, seeded, epoch-shuffled stream of problems whose position can be saved and restored.

    The position (``epoch``, ``offset``) goes into checkpoints so a resumed run sees exactly the prompts an
    uninterrupted one would, including the extra prompts dynamic sampling draws.
    """

    def __init__(self, problems: Sequence[Problem], seed: int):
        if not problems:
            raise DataError("the training set is empty")
        self.problems = list(problems)
        self.seed = seed
        self.epoch = 0
        self.offset = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.problems)))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def take(self, count: int) -> list[Problem]:
        batch = []
        for _ in range(count):
            if self.offset >= len(self._order):
                self.epoch += 1
                self.offset = 0
                self._order = self._permutation(self.epoch)
            batch.append(self.problems[self._order[self.offset]])
            self.offset += 1
        return batch

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
        self._order = self._permutation(self.epoch)

    def __iter__(self) -> Iterator[Problem]:
        while True:
            yield from self.take(1)
