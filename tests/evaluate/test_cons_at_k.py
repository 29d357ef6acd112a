"""cons@k (majority vote, exact average over all k-subsets) against a brute-force enumeration of the subsets."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from fractions import Fraction

import pytest

from tepo.passk import avg_at_k, cons_at_k, mean_cons_at_k


def brute_force(votes, correct, k) -> float:
    """Enumerate every k-subset; majority class wins, a t-way tie scores 1/t for the correct class."""
    right = {v for v, ok in zip(votes, correct) if ok}
    total, count = Fraction(0), 0
    for subset in itertools.combinations(range(len(votes)), k):
        count += 1
        tally = Counter(votes[i] for i in subset if votes[i] is not None)
        if not tally:
            continue
        top = max(tally.values())
        winners = [c for c, v in tally.items() if v == top]
        if right & set(winners):
            total += Fraction(1, len(winners))
    return float(total / count)


def test_hand_example_from_the_docstring():
    # (a, a, b, c), a correct, k = 2: (a,a) -> 1; four (a, b|c) pairs tie -> 1/2 each; (b, c) -> 0: 3/6.
    assert cons_at_k(["a", "a", "b", "c"], [1, 1, 0, 0], 2) == 0.5
    # k = 3: {a,a,b}, {a,a,c} -> 1; {a,b,c} twice -> 1/3 each: (2 + 2/3) / 4 = 2/3.
    assert cons_at_k(["a", "a", "b", "c"], [1, 1, 0, 0], 3) == pytest.approx(2 / 3, abs=1e-15)
    # k = n: one subset, a has the majority.
    assert cons_at_k(["a", "a", "b", "c"], [1, 1, 0, 0], 4) == 1.0


def test_wrong_majority_and_no_answers():
    # b (wrong) has 3 votes, a (correct) 2: with all 5, b wins.
    assert cons_at_k(["b", "b", "b", "a", "a"], [0, 0, 0, 1, 1], 5) == 0.0
    # Unanswered samples do not vote: one correct answer among non-answers wins alone.
    assert cons_at_k([None, None, "a"], [0, 0, 1], 3) == 1.0
    assert cons_at_k([None, None, "a"], [0, 0, 1], 1) == pytest.approx(1 / 3)
    assert cons_at_k([None, None], [0, 0], 2) == 0.0  # nobody answered
    assert cons_at_k(["b", "c"], [0, 0], 1) == 0.0  # no correct class


def test_cons_at_1_is_avg():
    votes, correct = ["a", "b", "a", None, "c", "a"], [1, 0, 1, 0, 0, 1]
    assert cons_at_k(votes, correct, 1) == pytest.approx(avg_at_k(6, [sum(correct)]))


@pytest.mark.parametrize("seed", range(40))
def test_equals_brute_force_enumeration(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 9)
    classes = rng.randint(1, 4)
    votes = [rng.choice([None, *range(classes)]) for _ in range(n)]
    good = rng.randrange(classes)
    correct = [v == good for v in votes]
    for k in range(1, n + 1):
        assert cons_at_k(votes, correct, k) == pytest.approx(brute_force(votes, correct, k), abs=1e-12), (
            votes,
            correct,
            k,
        )


def test_brute_force_check_can_fail():
    # The tie rule matters: scoring a tie as a win (1 instead of 1/t) would give 5/6, not 0.5.
    assert cons_at_k(["a", "a", "b", "c"], [1, 1, 0, 0], 2) != pytest.approx(5 / 6)


def test_mean_and_refusals():
    problems = [(["a", "a", "b"], [1, 1, 0]), (["b", "a", "b"], [0, 1, 0])]
    assert mean_cons_at_k(problems, 3) == 0.5
    with pytest.raises(ValueError, match="k <= n"):
        cons_at_k(["a"], [1], 2)
    with pytest.raises(ValueError, match="both correct and wrong"):
        cons_at_k(["a", "a"], [1, 0], 1)
    with pytest.raises(ValueError, match="verdicts"):
        cons_at_k(["a", "a"], [1], 1)
    with pytest.raises(ValueError, match="empty"):
        mean_cons_at_k([], 1)


# ----------------------------------------------------------------------------------------------------------------
# The evaluation path: answer classes by math-verify, samples.jsonl records, results and the compare table
# ----------------------------------------------------------------------------------------------------------------


def test_answer_votes_group_equivalent_answers_with_math_verify():
    from tepo.evaluate.voting import answer_votes
    from tepo.rewards import RewardPool

    extracted = [["\\frac{1}{2}", "0.5", "3", None, "7", "1/2"], ["4", "4", "2"]]
    correct = [[False, False, False, False, True, False], [True, True, False]]
    with RewardPool(num_workers=1, timeout_s=10.0) as pool:
        votes = answer_votes(extracted, correct, pool)
    # 1/2, 0.5 and 1/2 are one wrong answer (class 1), 3 another (2), the correct 7 is class 0, None no vote.
    assert votes == [[1, 1, 2, None, 0, 1], [0, 0, 1]]
    # With the two 1/2-answers one class, the wrong 1/2 wins a vote over all six: cons@6 = 0 (3 votes vs 1).
    assert cons_at_k(votes[0], correct[0], 6) == 0.0
    # Exact-string classes would split them (1 vote each) and let the correct answer tie: the grouping matters.
    strings = [None if a is None else a for a in extracted[0]]
    assert cons_at_k(strings, correct[0], 6) == pytest.approx(1 / 5)


def _response(status, extracted, vote):
    return {
        "status": status,
        "extracted": extracted,
        "vote": vote,
        "boxed": True,
        "tokens": 3,
        "truncated": False,
    }


def test_benchmark_metrics_report_cons_at_k_from_stored_votes():
    from tepo.evaluate.metrics import benchmark_metrics

    # Problem 0: votes (0, 1, 1, None): wrong class 1 holds 2 votes, correct 1. Problem 1: (0, 0, 2, 1).
    records = [
        {
            "responses": [
                _response("correct", "5", 0),
                _response("wrong", "1/2", 1),
                _response("wrong", "0.5", 1),
                _response("no_answer", None, None),
            ]
        },
        {
            "responses": [
                _response("correct", "2", 0),
                _response("correct", "2", 0),
                _response("wrong", "9", 2),
                _response("wrong", "8", 1),
            ]
        },
    ]
    m = benchmark_metrics(records, greedy=False, pass_k=[1, 2, 8])
    assert set(m["cons@k"]) == {"1", "2", "4"}  # requested k <= n, and n itself
    brute = [
        brute_force(
            [r.get("vote") for r in rec["responses"]], [r["status"] == "correct" for r in rec["responses"]], 4
        )
        for rec in records
    ]
    assert brute == [0.0, 1.0]
    assert m["cons@k"]["4"] == pytest.approx(0.5)
    assert m["cons@k"]["1"] == pytest.approx(m["avg@4"])
    # Records written before votes were stored: classes by exact string, so "1/2" and "0.5" split and tie
    # with the correct answer (1 vote each of 3): 1/3 on problem 0.
    for rec in records:
        for r in rec["responses"]:
            r.pop("vote", None)
    old = benchmark_metrics(records, greedy=False, pass_k=[])
    assert old["cons@k"]["4"] == pytest.approx((1 / 3 + 1.0) / 2)


def test_results_table_shows_cons_at_n():
    from tepo.evaluate.runner import results_table

    sampled = {"greedy": False, "temperature": 0.6}
    aime24 = dict(num_problems=30, samples_per_problem=4, accuracy=0.25, settings=sampled)
    aime24.update({"pass@k": {"4": 0.5}, "cons@k": {"4": 0.375}})
    table = results_table({"benchmarks": {"aime24": aime24}})
    assert "cons@n" in table and "37.5%" in table


def test_compare_table_shows_cons_column_only_when_logged(tmp_path):
    import json

    from tepo.compare.record import discover_runs
    from tepo.compare.table import build_table

    def run(path, cons):
        path.mkdir(parents=True)
        (path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward_mean": 0.1}) + "\n")
        (path / "config.yaml").write_text("{}\n")
        after = {"eval_greedy_accuracy": 0.5, "eval_sampled_accuracy": 0.4}
        if cons is not None:
            after["eval_sampled_cons"] = cons
        summary = {"steps": 1, "before": {}, "after": after, "reward_last_third": 0.1}
        (path / "summary.json").write_text(json.dumps(summary))

    run(tmp_path / "a" / "grpo" / "seed0", 0.6)
    run(tmp_path / "a" / "grpo" / "seed1", 0.8)
    table = build_table(discover_runs(tmp_path / "a"))
    (row,) = table["rows"]
    assert row["cells"]["sampled_cons"]["mean"] == pytest.approx(0.7)
    run(tmp_path / "b" / "grpo" / "seed0", None)
    assert "sampled_cons" not in [c["key"] for c in build_table(discover_runs(tmp_path / "b"))["columns"]]
