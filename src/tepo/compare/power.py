"""How small a paired difference a study of n seeds can detect, given the seed-to-seed spread of its differences.

A study pairs each method's run with the reference's run of the same seed and reports the mean paired difference
``d`` (``held_out_delta``). Read as a paired t-test with ``n`` seeds, the smallest true difference it detects at
two-sided level ``alpha`` with probability ``power`` is (the standard normal-approximation-free formula, e.g.
Cohen 1988, ch. 2; the t quantiles make it exact for normal differences with a known spread):

    delta_min = (t_{1 - alpha/2, n-1} + t_{power, n-1}) * s_d / sqrt(n)

``s_d`` is the standard deviation of the per-seed differences (Bessel's correction). The spread is measured on
the study's own seeds, so with few seeds it is itself uncertain: the number says what the measured spread allows,
not a guarantee. Student's t distribution is computed here (the regularized incomplete beta function by its
continued fraction, Numerical Recipes 3rd ed. 6.4) to avoid a SciPy dependency.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

_TINY = 1e-300


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz), converging for x < (a+1)/(a+b+2)."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):  # fmt: skip
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + numerator / c
            c = c if abs(c) > _TINY else _TINY
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def regularized_incomplete_beta(a: float, b: float, x: float) -> float:
    """``I_x(a, b)`` for ``a, b > 0`` and ``0 <= x <= 1``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, 1.0 - x) / b


def student_t_cdf(t: float, df: float) -> float:
    """``P(T <= t)`` for Student's t with ``df > 0`` degrees of freedom."""
    tail = 0.5 * regularized_incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def student_t_quantile(p: float, df: float) -> float:
    """The ``t`` with ``P(T <= t) = p`` (bisection to 1e-12 on the monotone CDF)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"a quantile needs 0 < p < 1, got {p}")
    if p < 0.5:
        return -student_t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while student_t_cdf(high, df) < p:
        high *= 2.0
    while high - low > 1e-12 * max(1.0, high):
        mid = (low + high) / 2.0
        low, high = (mid, high) if student_t_cdf(mid, df) < p else (low, mid)
    return (low + high) / 2.0


def detectable_paired_difference(sd: float, seeds: int, *, alpha: float = 0.05, power: float = 0.8) -> float:
    """``delta_min`` of the module docstring: the smallest mean paired difference that ``seeds`` seeds detect at
    two-sided level ``alpha`` with probability ``power``, when the per-seed differences spread by ``sd``."""
    if seeds < 2:
        raise ValueError(f"a paired spread needs at least 2 seeds, got {seeds}")
    df = seeds - 1
    factor = student_t_quantile(1.0 - alpha / 2.0, df) + student_t_quantile(power, df)
    return factor * sd / math.sqrt(seeds)


def paired_power_row(differences: Sequence[float], *, seeds: Sequence[int] = (), **kwargs) -> dict:
    """One method's paired differences, summarised: their mean and spread, and ``delta_min`` at the number of
    seeds measured and at each count in ``seeds`` (the spread measured on the differences at hand)."""
    n = len(differences)
    if n < 2:
        return {"n": n, "mean": differences[0] if differences else None, "sd": None, "detectable": {}}
    sd = statistics.stdev(differences)
    counts = sorted({n, *seeds})
    return {
        "n": n,
        "mean": statistics.fmean(differences),
        "sd": sd,
        "detectable": {k: detectable_paired_difference(sd, k, **kwargs) for k in counts if k >= 2},
    }
