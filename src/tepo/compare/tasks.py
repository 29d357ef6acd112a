"""``arithmetic-mix``: the default comparison task, a graded mixture of procedural arithmetic word problems.

Why a mixture (measured with the embedded SmolLM2-135M-Instruct, "Give the final answer as a number.", 64 new
tokens; see docs/compare.md): single-digit problems (``arithmetic``) start at about 46% greedy / 14% sampled and
a run learns them to 0.94-1.0 batch reward within 15-20 steps, so methods cannot separate there; two-step
two-digit problems (``arithmetic-multistep``) start near 3% greedy / 0% sampled, so a group of 8 samples almost
never holds a correct answer and there is no learning signal. The mixture interleaves three levels in equal
shares, so a batch always has groups with mixed rewards (signal) and the held-out score has room to grow long
after the easy third is learned:

- level 1: single-digit addition / multiplication (``tepo.data``'s single-step generator),
- level 2: one step with a two-digit number (``a + b`` with ``a, b`` in 10..99, or ``a x b`` with ``a`` in 2..9
  and ``b`` in 11..19),
- level 3: two-step, two-digit problems (``tepo.data``'s multi-step generator).

Problem ``i`` of a stream has level ``i % 3 + 1``, so any prefix (and any ``eval.size``) is balanced. Train and
test streams never share a problem text, as for the other procedural tasks.
"""

from __future__ import annotations

import random

from tepo.data import _BOXES, _NAMES, _THINGS, Problem, _multi_step, _single_step

TASK_NAME = "arithmetic-mix"


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
    rngs = [random.Random(f"{TASK_NAME}:{level}:{split}:{seed}") for level in range(len(LEVELS))]
    other: set[str] = set()
    if split != "test":
        # Everything the test stream would produce first (at least 200 per level) is barred from training.
        test_rngs = [random.Random(f"{TASK_NAME}:{level}:test:{seed}") for level in range(len(LEVELS))]
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
            Problem(id=f"{TASK_NAME}-{split}-{len(problems)}-L{level + 1}", problem=text, answer=str(answer))
        )
    return problems
