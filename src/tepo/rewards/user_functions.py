"""Reward functions of your own: loading them by file path or module name, telling verl's form from TRL's, and
calling them on plain JSON values.

This module runs inside the reward worker processes (see ``_worker.py``) as well as in the trainer (config
checks), so, like ``answers.py``, it imports only the standard library and nothing relative.

An entry of ``reward.functions`` ``{path: FILE.py or package.module, name: FUNCTION, weight: W}`` names one
function. Its form is told by its parameter names (the names verl and TRL call them with):

- **verl** (one response per call): it takes ``solution_str``, as verl's
  ``compute_score(data_source, solution_str, ground_truth, extra_info=None)`` does. It is called with keyword
  arguments, those of ``data_source``, ``solution_str``, ``ground_truth``, ``extra_info`` it accepts (all of
  them when it takes ``**kwargs``). It returns a number, or (as verl allows) a dict whose ``"score"`` is one.
- **TRL** (a batch per call): it takes ``prompts`` and ``completions``, as TRL's
  ``reward_func(prompts, completions, **kwargs)`` does. It is called with keyword lists: ``prompts``,
  ``completions``, ``ground_truth``, ``data_source`` and one list per ``extra_info`` key (a data set's other
  columns, as TRL passes them), each only if it accepts it (all of them with ``**kwargs``). It returns one
  number per completion; ``None`` means "does not apply" and scores 0 without counting an error (TRL's
  convention: its weighted sum skips it).

Anything else (no ``solution_str``, no ``prompts``/``completions``, or a required parameter outside these
names) is refused with one line before any model loads. A number is an ``int`` or ``float`` (``bool`` counts,
as in verl); NaN, infinities and anything else are errors that score 0.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import numbers
import sys
from pathlib import Path

KINDS = ("verl", "trl")
VERL_ARGUMENTS = ("data_source", "solution_str", "ground_truth", "extra_info")
TRL_ARGUMENTS = ("prompts", "completions")
EXPECTED_SIGNATURES = (
    "verl's compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float, "
    "or TRL's reward_func(prompts, completions, **kwargs) -> list[float]"
)


class RewardFunctionError(Exception):
    """A reward function that cannot be loaded or called as declared; the message is one line."""


def is_file_path(path: str) -> bool:
    """A path names a file when it ends in ``.py`` or holds a path separator; else it is a module name."""
    return path.endswith(".py") or "/" in path or "\\" in path


def load_function(path: str, name: str):
    """The function ``name`` of the Python file ``path`` (relative paths from the working directory, as verl
    reads ``custom_reward_function.path``) or of the importable module ``path`` (``package.module``)."""
    if is_file_path(path):
        file = Path(path).expanduser()
        if not file.is_file():
            raise RewardFunctionError(f"no such file {str(file)!r} (working directory: {Path.cwd()})")
        module_name = f"tepo_user_reward_{abs(hash(str(file.resolve())))}"
        spec = importlib.util.spec_from_file_location(module_name, file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # a dataclass in the file looks its module up there while defined
        try:
            spec.loader.exec_module(module)
        except SyntaxError as err:
            sys.modules.pop(module_name, None)
            raise RewardFunctionError(f"syntax error in {file} line {err.lineno}: {err.msg}") from None
        except BaseException as err:
            sys.modules.pop(module_name, None)
            raise RewardFunctionError(f"importing {file} failed: {type(err).__name__}: {err}") from None
    else:
        try:
            module = _import_module(path)
        except SyntaxError as err:
            raise RewardFunctionError(
                f"syntax error in {err.filename} line {err.lineno}: {err.msg}"
            ) from None
        except BaseException as err:
            raise RewardFunctionError(
                f"cannot import module {path!r} ({type(err).__name__}: {err}); a file path must end in .py"
            ) from None
    function = getattr(module, name, None)
    if function is None:
        found = sorted(
            key
            for key, value in vars(module).items()
            if inspect.isfunction(value) and not key.startswith("_") and value.__module__ == module.__name__
        )
        raise RewardFunctionError(
            f"{path} has no function {name!r} (its functions: {', '.join(found) or 'none'})"
        )
    if not callable(function):
        raise RewardFunctionError(f"{path}: {name!r} is a {type(function).__name__}, not a function")
    return function


def _import_module(path: str):
    """``import path``, the working directory searched too (as ``python -m`` would), whatever started us."""
    cwd = str(Path.cwd())
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(path)
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


def function_kind(function) -> str:
    """``"verl"`` or ``"trl"`` from the parameter names (see the module doc); else RewardFunctionError."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        raise RewardFunctionError(f"cannot read its signature; expected {EXPECTED_SIGNATURES}") from None
    names = {p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    if set(TRL_ARGUMENTS) <= names:
        kind, known = "trl", None  # TRL passes any data set column: every keyword is known
    elif "solution_str" in names:
        kind, known = "verl", set(VERL_ARGUMENTS)
    else:
        found = ", ".join(sorted(names)) or "none"
        raise RewardFunctionError(
            f"its parameters ({found}) fit neither form; expected {EXPECTED_SIGNATURES}"
        )
    for p in parameters:
        required = p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        if p.kind == p.POSITIONAL_ONLY or (required and known is not None and p.name not in known):
            raise RewardFunctionError(
                f"parameter {p.name!r} cannot be given by keyword ({kind} form); "
                f"expected {EXPECTED_SIGNATURES}"
            )
    return kind


def accepted_arguments(function, offered: dict) -> dict:
    """The items of ``offered`` that ``function`` takes by keyword (all of them if it takes ``**kwargs``)."""
    parameters = inspect.signature(function).parameters.values()
    if any(p.kind == p.VAR_KEYWORD for p in parameters):
        return offered
    names = {p.name for p in parameters}
    return {key: value for key, value in offered.items() if key in names}


def as_score(value) -> float:
    """A returned value as a finite float (a verl dict's ``"score"``); RewardFunctionError otherwise."""
    if isinstance(value, dict):
        if "score" not in value:
            raise RewardFunctionError(
                f"returned a dict without a 'score' key (keys: {sorted(map(str, value))})"
            )
        value = value["score"]
    if not isinstance(value, numbers.Real):
        raise RewardFunctionError(f"returned {type(value).__name__}, expected a number")
    score = float(value)
    if not math.isfinite(score):
        raise RewardFunctionError(f"returned {score}, expected a finite number")
    return score


def call_verl(function, arguments: dict) -> float:
    """One response's score from a verl-form function."""
    return as_score(function(**accepted_arguments(function, arguments)))


def call_trl(function, arguments: dict) -> tuple[list[float], list[int], str]:
    """A batch's scores from a TRL-form function, one per completion, the indices of the errors, and the first
    error's reason in one line (empty without errors): an element that is not a finite number scores 0 and is
    an error; ``None`` (TRL's "does not apply") scores 0 and is not."""
    values = function(**accepted_arguments(function, arguments))
    n = len(arguments["completions"])
    if not isinstance(values, list | tuple) or len(values) != n:
        got = f"{len(values)} values" if isinstance(values, list | tuple) else type(values).__name__
        raise RewardFunctionError(f"returned {got}, expected a list of {n} numbers (one per completion)")
    scores, errors, reason = [], [], ""
    for i, value in enumerate(values):
        try:
            scores.append(0.0 if value is None else as_score(value))
        except RewardFunctionError as err:
            scores.append(0.0)
            errors.append(i)
            reason = reason or f"element {i} {err}"
    return scores, errors, reason
