"""How many seeds a study needs, and how small a paired difference a study of n seeds can detect.

A study pairs each method's run with the reference's run of the same seed and tests the per-seed differences
``d_1..d_n``. With the differences spread by ``sd`` (Bessel's correction, measured on a pilot), the paired t-test
at two-sided level ``alpha`` detects a true mean difference ``delta`` with probability

    power_t(n) = P(|T| > t_{1 - alpha/2, n-1}),   T ~ noncentral t(n - 1, delta / (sd / sqrt(n)))

(Cohen 1988, ch. 2; ``scipy.stats.nct``), and the smallest difference detectable with probability ``power`` is,
to the usual approximation, ``delta_min = (t_{1 - alpha/2, n-1} + t_{power, n-1}) * sd / sqrt(n)``.

The study's own test is the sign-flip test (:func:`tepo.compare.stats.sign_flip_p`), whose p cannot fall below
``2 / 2^n``, so its power is simulated (:func:`simulated_power`): normal differences of mean ``delta`` and spread
``sd``, both tests applied, the share of draws with ``p < alpha``. Comparisons of ``m`` methods with one reference
are Holm-adjusted, so a plan uses ``alpha / m``, the level Holm holds the smallest p to (conservative when several
methods differ). The spread is measured on few seeds and is itself uncertain: a plan says what the measured spread
allows, not a guarantee (Colas et al. 2018, "How Many Random Seeds?").
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import numpy as np
from scipy import stats as scipy_stats

from tepo.compare.stats import sign_flip_p_rows

DEFAULT_ALPHA = 0.05
DEFAULT_POWER = 0.8
DEFAULT_SIMULATIONS = 2_000


def detectable_paired_difference(
    sd: float, seeds: int, *, alpha: float = DEFAULT_ALPHA, power: float = DEFAULT_POWER
) -> float:
    """``delta_min`` of the module docstring: the smallest mean paired difference that ``seeds`` seeds detect at
    two-sided level ``alpha`` with probability ``power``, when the per-seed differences spread by ``sd``."""
    if seeds < 2:
        raise ValueError(f"a paired spread needs at least 2 seeds, got {seeds}")
    df = seeds - 1
    factor = float(scipy_stats.t.ppf(1.0 - alpha / 2.0, df) + scipy_stats.t.ppf(power, df))
    return factor * sd / math.sqrt(seeds)


def t_test_power(delta: float, sd: float, seeds: int, *, alpha: float = DEFAULT_ALPHA) -> float:
    """Exact power of the two-sided paired t-test (noncentral t) for a true difference ``delta``."""
    if seeds < 2:
        return 0.0
    if sd <= 0:
        return 1.0 if delta != 0 else alpha
    df, nc = seeds - 1, delta / (sd / math.sqrt(seeds))
    crit = float(scipy_stats.t.ppf(1 - alpha / 2, df))
    return float(scipy_stats.nct.sf(crit, df, nc) + scipy_stats.nct.cdf(-crit, df, nc))


def simulated_power(
    delta: float,
    sd: float,
    seeds: int,
    *,
    alpha: float = DEFAULT_ALPHA,
    simulations: int = DEFAULT_SIMULATIONS,
    seed: int = 0,
) -> dict[str, float]:
    """Share of ``simulations`` normal studies (``seeds`` differences of mean ``delta``, spread ``sd``) in which the
    sign-flip test and the t-test reject at ``alpha``: ``{"sign_flip": ..., "t": ...}``."""
    if seeds < 2:
        return {"sign_flip": 0.0, "t": 0.0}
    rng = np.random.default_rng(seed)
    d = rng.normal(delta, sd, size=(simulations, seeds))
    spread = d.std(axis=1, ddof=1)
    t = d.mean(axis=1) / np.where(spread > 0, spread / math.sqrt(seeds), np.inf)
    p_t = 2 * scipy_stats.t.sf(np.abs(t), seeds - 1)
    p_flip = sign_flip_p_rows(d, resamples=2_000, rng=rng)
    return {"sign_flip": float(np.mean(p_flip < alpha)), "t": float(np.mean(p_t < alpha))}


def plan_seeds(
    sd: float,
    delta: float,
    *,
    comparisons: int = 1,
    alpha: float = DEFAULT_ALPHA,
    power: float = DEFAULT_POWER,
    max_seeds: int = 40,
    simulations: int = DEFAULT_SIMULATIONS,
    seed: int = 0,
) -> dict:
    """The fewest seeds whose sign-flip test (simulated) and t-test (exact) detect ``delta`` with ``power`` at the
    Holm level ``alpha / comparisons``; None where ``max_seeds`` do not suffice. The simulated power at each count
    tried is kept, so a reader sees how the power grows."""
    if delta == 0 or sd < 0:
        raise ValueError(
            f"plan_seeds: needs a non-zero target difference and sd >= 0, got delta={delta}, sd={sd}"
        )
    level = alpha / max(comparisons, 1)
    curve, needed_t, needed_flip = {}, None, None
    for n in range(2, max_seeds + 1):
        exact_t = t_test_power(delta, sd, n, alpha=level)
        if needed_t is None and exact_t >= power:
            needed_t = n
        if n <= 2 or (needed_flip is None and exact_t >= power * 0.5):
            simulated = simulated_power(delta, sd, n, alpha=level, simulations=simulations, seed=seed + n)
            curve[n] = {"t_exact": exact_t, **simulated}
            if needed_flip is None and simulated["sign_flip"] >= power:
                needed_flip = n
        if needed_t is not None and needed_flip is not None:
            break
    return {
        "sd": sd,
        "delta": delta,
        "alpha": alpha,
        "comparisons": comparisons,
        "level": level,
        "power": power,
        "seeds_t": needed_t,
        "seeds_sign_flip": needed_flip,
        "curve": curve,
        "max_seeds": max_seeds,
    }


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
