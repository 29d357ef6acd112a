"""pass@k (Chen et al. 2107.03374) and avg@k against hand-computed and exact rational values."""

from __future__ import annotations

from fractions import Fraction
from math import comb

import numpy as np
import pytest

from tepo.passk import avg_at_k, mean_pass_at_k, pass_at_k, pass_at_k_per_problem


def exact(n: int, c: int, k: int) -> float:
    return float(1 - Fraction(comb(n - c, k), comb(n, k)))


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (10, 3, 5, 11 / 12),  # 1 - C(7,5)/C(10,5) = 1 - 21/252
        (8, 3, 1, 0.375),  # k = 1: c / n
        (5, 4, 2, 1.0),  # n - c = 1 < k: every pair holds a correct sample
        (6, 0, 3, 0.0),  # c = 0
        (6, 6, 3, 1.0),  # c = n
        (6, 1, 6, 1.0),  # k = n, one correct: all samples drawn
        (6, 0, 6, 0.0),  # k = n, none correct
        (1000, 1, 1, 0.001),
    ],
)
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_pass_at_k_matches_exact_binomials_on_a_grid():
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(exact(n, c, k), rel=1e-12, abs=1e-15), (n, c, k)


def test_pass_at_k_large_n_is_stable():
    # The product form never forms the binomials (C(1024, 16) ~ 1e34; C(2000, 1000) overflows a float64);
    # it stays within 1e-12 of the exact rational value.
    assert pass_at_k(500, 3, 100) == pytest.approx(exact(500, 3, 100), rel=1e-12)
    assert pass_at_k(2000, 1, 1000) == pytest.approx(0.5, rel=1e-12)  # one correct among 2000, draw half
    value = pass_at_k(1024, 512, 16)
    assert value == pytest.approx(exact(1024, 512, 16), rel=1e-12)
    assert 0.0 <= value <= 1.0


def test_pass_at_k_accepts_numpy_ints():
    assert pass_at_k(np.int64(4), np.int32(1), np.int64(2)) == 0.5


@pytest.mark.parametrize(
    ("n", "c", "k", "message"),
    [
        (4, 1, 5, r"k <= n .*got k=5, n=4"),
        (4, 5, 2, r"0 <= c <= n .*got c=5, n=4"),
        (4, -1, 2, r"0 <= c <= n"),
        (0, 0, 1, r"n >= 1"),
        (4, 1, 0, r"k >= 1, got k=0"),
        (4, 1.5, 2, r"c must be an integer, got 1.5"),
        (4, True, 2, r"c must be an integer, got True"),
    ],
)
def test_pass_at_k_errors(n, c, k, message):
    with pytest.raises(ValueError, match=message):
        pass_at_k(n, c, k)


def test_vectorised_per_problem_and_mean():
    values = pass_at_k_per_problem([4, 5, 10], [1, 2, 3], 2)
    # (4,1,2) 0.5; (5,2,2) 0.7; (10,3,2) 1 - C(7,2)/C(10,2) = 1 - 21/45 = 24/45.
    np.testing.assert_allclose(values, [0.5, 0.7, 24 / 45], rtol=1e-12)
    assert values.dtype == np.float64
    assert mean_pass_at_k([4, 5, 10], [1, 2, 3], 2) == pytest.approx((0.5 + 0.7 + 24 / 45) / 3, rel=1e-12)
    # One shared sample count: n = 4, c = (0, 1, 4), k = 2 -> (0, 0.5, 1).
    np.testing.assert_allclose(pass_at_k_per_problem(4, np.array([0, 1, 4]), 2), [0.0, 0.5, 1.0])
    assert mean_pass_at_k(4, [0, 1, 4], 2) == pytest.approx(0.5)


def test_vectorised_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"problem index 1.*k=3, n=2"):
        pass_at_k_per_problem([4, 2], [1, 1], 3)
    with pytest.raises(ValueError, match=r"problem index 0.*c=5, n=4"):
        pass_at_k_per_problem(4, [5, 1], 1)
    with pytest.raises(ValueError, match=r"num_samples has 3 entries but num_correct has 2"):
        pass_at_k_per_problem([4, 4, 4], [1, 1], 1)
    with pytest.raises(ValueError, match=r"empty benchmark"):
        mean_pass_at_k(4, [], 1)


def test_avg_at_k():
    # n = 4 samples each, c = (1, 3, 0): (0.25 + 0.75 + 0) / 3 = 1/3.
    assert avg_at_k(4, [1, 3, 0]) == pytest.approx(1 / 3, rel=1e-12)
    # Per-problem sample counts: 1/2 and 2/8 -> (0.5 + 0.25) / 2.
    assert avg_at_k([2, 8], [1, 2]) == pytest.approx(0.375, rel=1e-12)
    # avg@k is the unbiased pass@1.
    assert avg_at_k([2, 8], [1, 2]) == pytest.approx(mean_pass_at_k([2, 8], [1, 2], 1), rel=1e-12)
    with pytest.raises(ValueError, match=r"problem index 1"):
        avg_at_k([2, 8], [1, 9])
    with pytest.raises(ValueError, match=r"empty benchmark"):
        avg_at_k(4, [])
