"""Answer checking as ``tepo eval`` does it: whole completions, answer format "boxed", the real math-verify pool.

tests/rewards/test_rewards.py compares bare answers (``math_equal``); this table goes through box extraction from a
completion as well, for these cases: fractions, ``\\frac`` vs ``/``, units, intervals, nested braces
inside ``\\boxed{}``, multiple answers. Readings we chose (and test): only the *last* complete box is the answer
(two boxes "2" and "-3" answer "-3"), a box cut off by the token limit is no answer, and with format "boxed" a bare
number in prose is no answer (the benchmark instruction asks for a box).
"""

from __future__ import annotations

import pytest

from tepo.rewards import RewardPool

CASES = [
    # fractions, \frac vs /
    ("3/4", "so the answer is $\\boxed{\\frac{3}{4}}$.", "correct"),
    ("\\frac{3}{4}", "Thus \\boxed{3/4}.", "correct"),
    ("\\frac34", "\\boxed{\\dfrac{3}{4}}", "correct"),
    ("\\frac{3}{4}", "\\boxed{0.75}", "correct"),
    ("\\frac{6}{8}", "\\boxed{\\frac{3}{4}}", "correct"),
    ("\\frac{3}{4}", "\\boxed{\\frac{4}{3}}", "wrong"),
    ("\\sqrt{2}/2", "\\boxed{\\frac{\\sqrt{2}}{2}}", "correct"),
    ("\\frac{\\sqrt{3}}{3}", "\\boxed{\\frac{1}{\\sqrt{3}}}", "correct"),
    # units (math-verify drops them: a leniency shared with the papers' checkers)
    ("12", "\\boxed{12\\text{ cm}^2}", "correct"),
    ("12", "\\boxed{12 \\mbox{ cm}}", "correct"),
    ("1.6", "\\boxed{1.6 \\mathrm{~cm}}", "correct"),  # Minerva-style unit
    ("30", "\\boxed{30^\\circ}", "correct"),
    ("30^\\circ", "\\boxed{30}", "correct"),
    ("5", "\\boxed{\\$5}", "correct"),
    ("5", "\\boxed{5 \\text{ dollars}}", "correct"),
    # intervals
    ("[2, \\infty)", "\\boxed{[2,\\infty)}", "correct"),
    ("[2, \\infty)", "\\boxed{(2,\\infty)}", "wrong"),
    ("(-\\infty, -1) \\cup (1, \\infty)", "\\boxed{(-\\infty,-1)\\cup(1,\\infty)}", "correct"),
    ("(-\\infty, -1) \\cup (1, \\infty)", "\\boxed{(-\\infty,-1]\\cup(1,\\infty)}", "wrong"),
    # nested braces inside the box
    ("\\frac{1}{6}", "\\boxed{\\frac{\\frac{1}{2}}{3}}", "correct"),
    ("x^{2^{3}}", "\\boxed{x^{8}}", "correct"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "\\boxed{(3, \\frac{\\pi}{2})}", "correct"),  # MATH-500 problem 1
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "\\boxed{(3, \\pi)}", "wrong"),
    ("\\{1, 2\\}", "\\boxed{\\{1,2\\}}", "correct"),
    ("\\frac{1}{2}", "\\boxed{\\frac{1}{2}", "no_answer"),  # cut off by the token limit
    # multiple answers (OlympiadBench joins them with ", ")
    ("2, -3", "\\boxed{-3, 2}", "correct"),
    ("2, -3", "\\boxed{x = 2, x = -3}", "correct"),
    ("2, -3", "\\boxed{x=2 \\text{ or } x=-3}", "correct"),
    ("2, -3", "\\boxed{2}", "wrong"),
    ("2, -3", "\\boxed{2, -3, 5}", "wrong"),
    ("2, -3", "\\boxed{2} and \\boxed{-3}", "wrong"),  # only the last box counts
    # which box, and no box
    ("5", "First \\boxed{4}, wait, no: \\boxed{5}", "correct"),
    ("5", "First \\boxed{5}, wait, no: \\boxed{4}", "wrong"),
    ("18", "The answer is 18.", "no_answer"),
]


@pytest.fixture(scope="module")
def pool():
    with RewardPool(num_workers=2, timeout_s=10.0, answer_format="boxed") as p:
        yield p


def test_tricky_equivalences_through_the_eval_reward_path(pool):
    results = pool.score([c[1] for c in CASES], [c[0] for c in CASES])
    got = [(gold, response, r.status) for (gold, response, _), r in zip(CASES, results)]
    assert got == [(gold, response, status) for gold, response, status in CASES]
