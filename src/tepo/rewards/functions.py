"""Named reward functions of ``reward.functions``: each response gets one reward per function, and the reward
the advantage estimators read is their weighted sum (GDPO, ``algorithm.advantage=gdpo``, reads each column).

- ``correctness``: math-verify's verdict from the sandboxed worker pool (``pool.py``): 1 correct, 0 otherwise
  (wrong, no answer, timeout, error). Always computed: ``reward_mean`` and ``accuracy`` are this reward.
- ``format``: 1 when the completion gives its final answer in ``\\boxed{...}`` (a complete, non-empty last box
  in its last ``max_chars`` characters once the trailer is dropped: ``extract_final_answer(text, "boxed")``),
  else 0, whether the answer is right or not. The usual format reward of R1-style recipes and of GDPO's
  experiments, on the answer format math benchmarks grade (``reward.answer_format=boxed``).

Model output is untrusted: ``format`` is a linear scan of at most ``max_chars`` characters with the pool's own
extraction (no regular expression that backtracks, nothing evaluated), so it runs in the trainer process without
a sandbox; anything that parses or evaluates an answer goes through the pool's workers and their hard timeouts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .answers import DEFAULT_MAX_CHARS, extract_final_answer

REWARD_FUNCTIONS = {
    "correctness": "1 if math-verify finds the final answer equal to the reference (sandboxed workers), else 0",
    "format": "1 if the final answer is given in \\boxed{...} (right or wrong), else 0",
}
DEFAULT_REWARD_FUNCTIONS = ({"name": "correctness", "weight": 1.0},)


def parse_reward_functions(value: Any) -> tuple[list[tuple[str, float]], list[str]]:
    """``reward.functions`` (a list of ``{name, weight}`` mappings; ``weight`` defaults to 1) as ``[(name,
    weight)]``, and one message per problem (unknown name, repeated name, bad weight, empty list)."""
    where = "reward.functions"
    if not isinstance(value, list | tuple) or not value:
        return [], [
            f"{where}: expected a non-empty list of {{name, weight}}, e.g. "
            "[{name: correctness, weight: 1.0}, {name: format, weight: 0.5}]; got "
            f"{value!r}"
        ]
    parsed, errors = [], []
    for i, entry in enumerate(value):
        if isinstance(entry, str):
            entry = {"name": entry}
        if not isinstance(entry, dict) or set(entry) - {"name", "weight"} or "name" not in entry:
            errors.append(f"{where}[{i}]: expected a mapping with keys name and weight, got {entry!r}")
            continue
        name, weight = entry["name"], entry.get("weight", 1.0)
        if name not in REWARD_FUNCTIONS:
            errors.append(
                f"{where}[{i}]: unknown reward function {name!r} (known: {', '.join(REWARD_FUNCTIONS)})"
            )
            continue
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight):
            errors.append(f"{where}[{i}] ({name}): weight must be a finite number, got {weight!r}")
            continue
        if any(name == seen for seen, _ in parsed):
            errors.append(f"{where}: {name!r} is listed twice")
            continue
        parsed.append((name, float(weight)))
    return parsed, errors


def format_reward(text: str, *, max_chars: int = DEFAULT_MAX_CHARS) -> float:
    """1.0 when ``text`` gives its final answer in a complete, non-empty ``\\boxed{...}`` (the last one in its
    last ``max_chars`` characters), else 0.0. Linear in ``max_chars``; evaluates nothing."""
    return 1.0 if extract_final_answer(text, "boxed", max_chars=max_chars) is not None else 0.0


def reward_columns(
    names: Sequence[str], texts: Sequence[str], correctness: Sequence[float]
) -> list[list[float]]:
    """One list per function of ``names`` (in order), each with one reward per response: ``correctness`` from
    the pool's verdicts, the others computed here from ``texts``."""
    columns = []
    for name in names:
        if name == "correctness":
            columns.append([float(r) for r in correctness])
        elif name == "format":
            columns.append([format_reward(t) for t in texts])
        else:
            raise ValueError(f"unknown reward function {name!r} (known: {', '.join(REWARD_FUNCTIONS)})")
    return columns
