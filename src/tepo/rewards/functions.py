"""The reward functions of ``reward.functions``: each response gets one reward per function, and the reward
the advantage estimators read is their weighted sum (GDPO, ``algorithm.advantage=gdpo``, reads each column).

Built-in, by name:

- ``correctness``: math-verify's verdict from the sandboxed worker pool (``pool.py``): 1 correct, 0 otherwise
  (wrong, no answer, timeout, error). ``reward_mean`` and ``accuracy`` are this reward whenever it is
  computed: always, except in a run whose functions are the user's own and do not list it (see below).
- ``format``: 1 when the completion gives its final answer in ``\\boxed{...}`` (a complete, non-empty last box
  in its last ``max_chars`` characters once the trailer is dropped: ``extract_final_answer(text, "boxed")``),
  else 0, whether the answer is right or not. The usual format reward of R1-style recipes and of GDPO's
  experiments, on the answer format math benchmarks grade (``reward.answer_format=boxed``).

The user's own, by path: ``{path: FILE.py or package.module, name: FUNCTION, weight: W, label: LABEL}``
(``label`` defaults to ``name``; it names the column and the metrics ``reward/<label>_mean``,
``reward/<label>_errors``, ``reward/<label>_timeouts``). verl's per-response ``compute_score`` and TRL's
batched ``reward_func`` are both accepted, told apart by their parameter names (``user_functions.py``). They
run in the pool's workers under its per-item timeout (``reward.timeout_s``): a verl-form function is called
once per response, a TRL-form one once per prompt's group of ``G`` completions, the timeout applying to each
call (a group whose call times out scores 0 for all its ``G`` completions). A call that raises, returns a
non-number or hangs scores 0, is counted, and the run goes on. The data a function gets is in
``user_call_arguments``.

When the functions are the user's own and ``correctness`` is not among them, the task is not taken for math:
math-verify is not run, and ``reward_mean``, ``reward_std``, ``accuracy`` (the share of responses above 0.5)
and dynamic sampling read the functions' weighted sum instead.

Model output is untrusted: ``format`` is a linear scan of at most ``max_chars`` characters with the pool's own
extraction (no regular expression that backtracks, nothing evaluated), so it runs in the trainer process without
a sandbox; anything that parses or evaluates an answer, and every function of the user's, goes through the
pool's workers and their hard timeouts, with JSON values only crossing to them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .answers import DEFAULT_MAX_CHARS, extract_final_answer, strip_trailer
from .user_functions import RewardFunctionError, function_kind, is_file_path, load_function

REWARD_FUNCTIONS = {
    "correctness": "1 if math-verify finds the final answer equal to the reference (sandboxed workers), else 0",
    "format": "1 if the final answer is given in \\boxed{...} (right or wrong), else 0",
}
DEFAULT_REWARD_FUNCTIONS = ({"name": "correctness", "weight": 1.0},)
_LABEL = re.compile(r"[A-Za-z0-9_.-]+")
_WHERE = "reward.functions"


@dataclass(frozen=True)
class UserRewardFunction:
    """One of the user's reward functions: ``label`` names its column and metrics, ``path`` is a ``.py`` file
    or a module name, ``name`` the function in it, ``entry`` its place in ``reward.functions``."""

    label: str
    path: str
    name: str
    entry: int = field(default=0, compare=False)

    def for_pool(self) -> dict:
        """What the pool's workers import: a file path made absolute, so a later ``chdir`` cannot lose it."""
        path = str(Path(self.path).expanduser().resolve()) if is_file_path(self.path) else self.path
        return {"label": self.label, "path": path, "name": self.name}


def _parse_entry(
    i: int, entry: Any
) -> tuple[tuple[str, float] | None, UserRewardFunction | None, str | None]:
    """One entry of ``reward.functions``: its ``(label, weight)``, its user function (None for a built-in), or
    the one-line reason it is refused."""
    if isinstance(entry, str):
        entry = {"name": entry}
    if not isinstance(entry, dict) or set(entry) - {"name", "weight", "path", "label"} or "name" not in entry:
        return (
            None,
            None,
            (
                f"{_WHERE}[{i}]: expected a mapping with keys name and weight (and path, label for a "
                f"function of your own), got {entry!r}"
            ),
        )
    name, weight = entry["name"], entry.get("weight", 1.0)
    user = None
    if "path" in entry:
        path, label = entry["path"], entry.get("label", name)
        if not isinstance(path, str) or not path.strip() or not isinstance(name, str) or not name:
            return None, None, f"{_WHERE}[{i}]: path and name must be non-empty strings, got {entry!r}"
        if not isinstance(label, str) or not _LABEL.fullmatch(label):
            return None, None, f"{_WHERE}[{i}]: label must be letters, digits, '_', '.' or '-', got {label!r}"
        if label in REWARD_FUNCTIONS:
            return (
                None,
                None,
                (
                    f"{_WHERE}[{i}]: {label!r} is a built-in reward's name; give the function from {path} "
                    "another label (label: my_name)"
                ),
            )
        user, name = UserRewardFunction(label, path, entry["name"], i), label
    elif "label" in entry:
        return None, None, f"{_WHERE}[{i}] ({name}): label is for a function of your own (with path)"
    elif name not in REWARD_FUNCTIONS:
        return (
            None,
            None,
            (
                f"{_WHERE}[{i}]: unknown reward function {name!r} (known: {', '.join(REWARD_FUNCTIONS)}; "
                "a function of your own needs a path: {path: my_rewards.py, name: compute_score})"
            ),
        )
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight):
        return None, None, f"{_WHERE}[{i}] ({name}): weight must be a finite number, got {weight!r}"
    return (name, float(weight)), user, None


def _parse_all(value: Any) -> tuple[list[tuple[str, float]], list[UserRewardFunction], list[str]]:
    if not isinstance(value, list | tuple) or not value:
        return (
            [],
            [],
            [
                f"{_WHERE}: expected a non-empty list of {{name, weight}}, e.g. "
                "[{name: correctness, weight: 1.0}, {name: format, weight: 0.5}]; got "
                f"{value!r}"
            ],
        )
    parsed, users, errors = [], [], []
    for i, entry in enumerate(value):
        pair, user, error = _parse_entry(i, entry)
        if error is not None:
            errors.append(error)
        elif any(pair[0] == seen for seen, _ in parsed):
            errors.append(f"{_WHERE}: {pair[0]!r} is listed twice (a function of your own can take a label)")
        else:
            parsed.append(pair)
            users += [user] if user is not None else []
    return parsed, users, errors


def parse_reward_functions(value: Any) -> tuple[list[tuple[str, float]], list[str]]:
    """``reward.functions`` (a list of ``{name, weight}`` or ``{path, name, weight, label}`` mappings;
    ``weight`` defaults to 1) as ``[(label, weight)]`` (a built-in's label is its name), and one message per
    problem (unknown name, repeated label, bad weight, empty list). Cheap: it loads no file (see
    ``user_reward_function_errors``)."""
    parsed, _, errors = _parse_all(value)
    return parsed, errors


def user_reward_functions(value: Any) -> list[UserRewardFunction]:
    """The user's own functions of ``reward.functions``, in order (the entries that parse)."""
    return _parse_all(value)[1]


def user_reward_function_errors(value: Any) -> list[str]:
    """One line per user function that cannot be loaded in the form verl or TRL call it: missing file or
    module, syntax error, missing function, unusable signature. Imports each file (the user's own code) here,
    in the calling process; model output never reaches it here."""
    errors = []
    for user in user_reward_functions(value):
        try:
            function_kind(load_function(user.path, user.name))
        except RewardFunctionError as err:
            errors.append(f"{_WHERE}[{user.entry}] ({user.label}: path {user.path}, name {user.name}): {err}")
    return errors


def format_reward(text: str, *, max_chars: int = DEFAULT_MAX_CHARS) -> float:
    """1.0 when ``text`` gives its final answer in a complete, non-empty ``\\boxed{...}`` (the last one in its
    last ``max_chars`` characters), else 0.0. Linear in ``max_chars``; evaluates nothing."""
    return 1.0 if extract_final_answer(text, "boxed", max_chars=max_chars) is not None else 0.0


def reward_columns(
    names: Sequence[str], texts: Sequence[str], correctness: Sequence[float]
) -> list[list[float]]:
    """One list per built-in function of ``names`` (in order), each with one reward per response:
    ``correctness`` from the pool's verdicts, the others computed here from ``texts``."""
    columns = []
    for name in names:
        if name == "correctness":
            columns.append([float(r) for r in correctness])
        elif name == "format":
            columns.append([format_reward(t) for t in texts])
        else:
            raise ValueError(f"unknown reward function {name!r} (known: {', '.join(REWARD_FUNCTIONS)})")
    return columns


def verl_call_arguments(problem, completion: str) -> dict:
    """What a verl-form function gets for one response (the mapping of a data row is ``tepo.data.Problem``'s:
    ``data_source`` the row's own or the data set's name, ``ground_truth`` the answer field, ``extra_info``
    the row's other fields): keyword arguments, JSON values only."""
    return {
        "data_source": problem.data_source,
        "solution_str": strip_trailer(completion),
        "ground_truth": problem.answer,
        "extra_info": dict(problem.extra_info),
    }


def trl_call_arguments(problem, completions: Sequence[str]) -> dict:
    """What a TRL-form function gets for one prompt's group: ``prompts`` (the problem text, once per
    completion), ``completions``, ``ground_truth``, ``data_source``, and one list per ``extra_info`` key (a
    data set's other columns, as TRL passes them; a key with one of the four names above is left out)."""
    n = len(completions)
    own = {
        "prompts": [problem.problem] * n,
        "completions": [strip_trailer(c) for c in completions],
        "ground_truth": [problem.answer] * n,
        "data_source": [problem.data_source] * n,
    }
    return {**{key: [value] * n for key, value in problem.extra_info.items() if key not in own}, **own}


@dataclass
class ScoredResponses:
    """The rewards of a batch of responses: ``columns`` one list per function (``reward.functions`` order),
    one value per response; ``verdicts`` math-verify's (None when it was not run); per user function, each
    response's status (one of ``CALL_STATUSES``: ``"scored"``, or ``"error"`` / ``"timeout"`` that scored
    0) and, in ``details``, the reason of each failure (empty for ``"scored"``)."""

    columns: list[list[float]]
    verdicts: list | None = None
    statuses: dict[str, list[str]] = field(default_factory=dict)
    details: dict[str, list[str]] = field(default_factory=dict)  # per user function, why each failure failed

    @property
    def errors(self) -> dict[str, int]:
        """Per user function, how many responses scored 0 for an error."""
        return {name: s.count("error") for name, s in self.statuses.items()}

    @property
    def timeouts(self) -> dict[str, int]:
        """Per user function, how many responses scored 0 for a timeout."""
        return {name: s.count("timeout") for name, s in self.statuses.items()}


def runs_math_verify(names: Sequence[str]) -> bool:
    """Whether math-verify scores a run's responses: unless every function is the user's own and none is
    ``correctness`` (see the module doc)."""
    return "correctness" in names or all(name in REWARD_FUNCTIONS for name in names)


def score_responses(
    pool,
    names: Sequence[str],
    texts: Sequence[str],
    problems: Sequence,
    group_size: int,
    *,
    step: int | None = None,
):
    """Score ``texts`` (``group_size`` contiguous responses per problem of ``problems``) with every function
    of ``names`` (labels of ``parse_reward_functions``): math-verify and the user's functions all queued in
    ``pool`` before any is waited for, so they run side by side in its workers.

    The user's functions' failures go to ``pool.failures`` when the pool has a record
    (``failures.RewardFailures``: a console warning, the failures file, and ``RewardFunctionsFailing`` when
    a function failed too often in this batch); ``step`` names the training step in that record."""
    g = group_size
    math_future = None
    if runs_math_verify(names):
        math_future = pool.submit(list(texts), [p.answer for p in problems for _ in range(g)])
    calls = {}
    for name in names:
        if name in REWARD_FUNCTIONS:
            continue
        if pool.function_kinds[name] == "verl":
            arguments = [verl_call_arguments(problems[i // g], text) for i, text in enumerate(texts)]
        else:
            arguments = [trl_call_arguments(p, texts[j * g : (j + 1) * g]) for j, p in enumerate(problems)]
        calls[name] = (pool.submit_calls(name, arguments), 1 if pool.function_kinds[name] == "verl" else g)
    verdicts = math_future.result() if math_future is not None else None
    scored = ScoredResponses(columns=[], verdicts=verdicts)
    correctness = [v.reward for v in verdicts] if verdicts is not None else []
    for name in names:
        if name in REWARD_FUNCTIONS:
            scored.columns += reward_columns([name], texts, correctness)
        else:
            future, width = calls[name]
            column, statuses, details = _call_column(future.result(), width)
            scored.columns.append(column)
            scored.statuses[name] = statuses
            scored.details[name] = details
    failures = getattr(pool, "failures", None)
    if failures is not None:
        failures.record(scored, texts, step)
    return scored


def _call_column(results: Sequence, width: int) -> tuple[list[float], list[str], list[str]]:
    """One value, one status and one failure reason per response from a user function's call results, each
    call scoring ``width`` responses (1 for a verl-form function, a group for a TRL-form one); a failed call
    costs all its ``width`` responses, a TRL element that is not a number its own."""
    column, statuses, details = [], [], []
    for r in results:
        if r.status != "scored":
            column += [0.0] * width
            statuses += [r.status] * width
            details += [r.detail or r.status] * width
            continue
        values = list(r.values) or [r.reward]  # a TRL-form call has its group's values
        column += values
        failed = [i in r.element_errors for i in range(len(values))]
        statuses += ["error" if bad else "scored" for bad in failed]
        details += [(r.detail or "error") if bad else "" for bad in failed]
    return column, statuses, details


_LABEL = re.compile(r"[A-Za-z0-9_.-]+")  # a label: no path separator, no colon


def reward_functions_from_specs(specs: list[str] | None, flag: str = "--reward-function") -> list:
    """Command-line ``[LABEL=]PATH:NAME`` values as the user's reward functions, each loaded and checked with the
    checks of ``reward.functions`` before any model loads; ValueError with one line per problem, naming ``flag``."""
    entries = []
    for spec in specs or []:
        label, has_label, rest = spec.partition("=")
        if not has_label or not _LABEL.fullmatch(label):
            label, rest = None, spec
        path, sep, name = rest.rpartition(":")
        if not sep or not path or not name:
            raise ValueError(
                f"{flag} {spec!r}: expected [LABEL=]PATH:NAME, e.g. my_rewards.py:compute_score "
                "or mine=my_rewards.py:compute_score"
            )
        entries.append({"path": path, "name": name, **({"label": label} if label else {})})
    if not entries:
        return []
    errors = parse_reward_functions(entries)[1] or user_reward_function_errors(entries)
    if errors:
        raise ValueError("; ".join(e.replace("reward.functions", flag, 1) for e in errors))
    return user_reward_functions(entries)
