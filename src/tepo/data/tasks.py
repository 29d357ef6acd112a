"""Procedural tasks: deterministic arithmetic word problems, with ``train`` and ``test`` streams that never share a
problem text.

- ``arithmetic`` (the embedded default): single-digit addition and multiplication as short word problems,
- ``arithmetic-multistep``: two-digit, two-step problems, where the embedded model starts near 0,
- ``arithmetic-mix``: the default comparison task, a graded mixture of procedural arithmetic word problems.

Why a mixture (measured with the embedded SmolLM2-135M-Instruct, "Give the final answer as a number.", 64 new
tokens; see docs/compare.md): single-digit problems (``arithmetic``) start at about 46% greedy / 14% sampled and
a run learns them to 0.94-1.0 batch reward within 15-20 steps, so methods cannot separate there; two-step
two-digit problems (``arithmetic-multistep``) start near 3% greedy / 0% sampled, so a group of 8 samples almost
never holds a correct answer and there is no learning signal. The mixture interleaves three levels in equal
shares, so a batch always has groups with mixed rewards (signal) and the held-out score has room to grow long
after the easy third is learned:

- level 1: single-digit addition / multiplication (``arithmetic``'s generator),
- level 2: one step with a two-digit number (``a + b`` with ``a, b`` in 10..99, or ``a x b`` with ``a`` in 2..9
  and ``b`` in 11..19),
- level 3: two-step, two-digit problems (``arithmetic-multistep``'s generator).

Problem ``i`` of a stream has level ``i % 3 + 1``, so any prefix (and any ``eval.size``) is balanced. Train and
test streams never share a problem text, as for the other procedural tasks.
"""

from __future__ import annotations

import random

from tepo.data.problems import Problem

MIXTURE_TASK = "arithmetic-mix"
PROCEDURAL_TASKS = ("arithmetic", "arithmetic-multistep", MIXTURE_TASK)

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
        problems.append(
            Problem(id=f"{task}-{split}-{len(problems)}", problem=text, answer=str(answer), data_source=task)
        )
    return problems


# --------------------------------------------------------------------------------------------------------------


def _two_digit_step(rng: random.Random) -> tuple[str, int]:
    name, thing, box = rng.choice(_NAMES), rng.choice(_THINGS), rng.choice(_BOXES)
    if rng.random() < 0.5:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        return f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?", a + b
    a, b = rng.randint(2, 9), rng.randint(11, 19)
    return (
        f"{name} has {a} {box} with {b} {thing} in each. How many {thing} does {name} have in total?",
        a * b,
    )


LEVELS = (_single_step, _two_digit_step, _multi_step)


def make_mixture_problems(count: int, *, split: str = "train", seed: int = 0) -> list[Problem]:
    """``count`` deterministic problems cycling through the three levels; train never repeats a test text."""
    if count < 0:
        raise ValueError(f"make_mixture_problems: count must be >= 0, got {count}")
    rngs = [random.Random(f"{MIXTURE_TASK}:{level}:{split}:{seed}") for level in range(len(LEVELS))]
    other: set[str] = set()
    if split != "test":
        # Everything the test stream would produce first (at least 200 per level) is barred from training.
        test_rngs = [random.Random(f"{MIXTURE_TASK}:{level}:test:{seed}") for level in range(len(LEVELS))]
        for make, rng in zip(LEVELS, test_rngs):
            other |= {make(rng)[0] for _ in range(max(count // len(LEVELS) + 1, 200))}
    problems: list[Problem] = []
    seen: set[str] = set()
    attempts = 0
    while len(problems) < count:
        attempts += 1
        if attempts > 100 * count + 1000:
            break  # the level-1 space is finite: return what exists rather than spin
        level = len(problems) % len(LEVELS)
        text, answer = LEVELS[level](rngs[level])
        if text in seen or text in other:
            continue
        seen.add(text)
        problems.append(
            Problem(
                id=f"{MIXTURE_TASK}-{split}-{len(problems)}-L{level + 1}",
                problem=text,
                answer=str(answer),
                data_source=MIXTURE_TASK,
            )
        )
    return problems


def make_task_problems(task: str, count: int, *, split: str = "train", seed: int = 0) -> list[Problem]:
    """``count`` problems of the procedural task ``task`` (one of :data:`PROCEDURAL_TASKS`)."""
    if task == MIXTURE_TASK:
        return make_mixture_problems(count, split=split, seed=seed)
    if task in PROCEDURAL_TASKS:
        return make_arithmetic_problems(task, count, split=split, seed=seed)
    raise ValueError(f"unknown procedural task {task!r}; expected one of {', '.join(PROCEDURAL_TASKS)}")
