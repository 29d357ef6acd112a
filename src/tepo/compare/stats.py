"""Uncertainty over seeds and problems: small-sample tests that hold at the number of seeds a study has.

Every number here is a function of a few values (one per seed) or a seeds x problems matrix, and each says what
it assumes:

- :func:`t_interval`: the mean of ``n`` values with its Student-t interval, ``mean +/- t_{(1+c)/2, n-1} s / sqrt(n)``
  (``s`` with Bessel's correction). It assumes roughly normal values; at ``n = 3, 6, 12`` it covers the true mean
  of normal data 95% of the time (tested by simulation), unlike the percentile bootstrap, which can never leave
  ``[min, max]`` and at 3 seeds is the range. One value gives no interval (``low = high = None``).
- :func:`sign_flip_p`: the exact two-sided paired permutation test of "the differences are symmetric about 0"
  (Fisher 1935; Good, *Permutation Tests*, 2000, ch. 3). Under that null each difference's sign is a fair coin,
  so every one of the ``2^n`` sign assignments is equally likely; ``p`` is the share of assignments whose
  ``|sum|`` is at least the observed one. No normality is assumed. Its smallest value is ``2 / 2^n``: 0.25 at
  3 seeds, 0.031 at 6. Above :data:`EXACT_SIGN_FLIP_MAX_N` differences it is estimated from
  :data:`SIGN_FLIP_RESAMPLES` random assignments with a fixed seed, as ``(1 + hits) / (1 + resamples)``.
- :func:`paired_t_p`: Student's paired t-test p-value (two-sided), shown beside the sign-flip p.
- :func:`holm`: Holm's step-down adjustment (Holm 1979) of the p-values of the comparisons made against one
  reference, which controls the family-wise error rate without assuming independence.
- :func:`iqm` and :func:`probability_of_improvement`: the aggregates of rliable (Agarwal et al., NeurIPS 2021,
  "Deep RL at the Edge of the Statistical Precipice"): the interquartile mean over runs, and
  ``P(X > Y) = mean_{i,j} [x_i > y_j] + 0.5 [x_i = y_j]`` over all run pairs, with its percentile interval from
  resampling each method's runs (stratified bootstrap).
- :func:`two_way_bootstrap`: the mean of a seeds x problems matrix of paired differences with a percentile
  interval from resampling seeds and problems independently (the crossed bootstrap of Miller 2024, "Adding Error
  Bars to Evals", arXiv 2411.00640, Sec. on clustered data; Owen 2007), so it describes new seeds *and* new
  problems.

Resampling is seeded (``numpy.random.default_rng(seed)``), so the same inputs always give the same numbers.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats

DEFAULT_CONFIDENCE = 0.95
DEFAULT_RESAMPLES = 10_000
DEFAULT_BOOTSTRAP_SEED = 0
EXACT_SIGN_FLIP_MAX_N = 16
SIGN_FLIP_RESAMPLES = 100_000
T_INTERVAL = "student-t"
# Two statistics closer than this are equal: sums of accuracies are multiples of 1/problems, and float addition in
# another order must not turn a tie into a strict inequality.
_TIE = 1e-9


@dataclass(frozen=True)
class Interval:
    """Mean of ``values`` with its interval ``[low, high]`` (None with a single value); ``method`` names it."""

    mean: float
    low: float | None
    high: float | None
    n: int
    values: tuple[float, ...]
    method: str = T_INTERVAL

    def to_dict(self) -> dict:
        return {
            "mean": self.mean,
            "low": self.low,
            "high": self.high,
            "n": self.n,
            "values": list(self.values),
            "interval": self.method,
        }


def _finite(values: Sequence[float], what: str) -> np.ndarray:
    xs = np.asarray([float(v) for v in values], dtype=np.float64)
    if xs.size == 0:
        raise ValueError(f"{what}: no values (expected one value per seed)")
    if not np.all(np.isfinite(xs)):
        raise ValueError(f"{what}: values must be finite numbers, got {list(xs)}")
    return xs


def t_interval(values: Sequence[float], *, confidence: float = DEFAULT_CONFIDENCE) -> Interval:
    """Mean and Student-t interval (``n - 1`` degrees of freedom) of ``values``, one per seed."""
    if not 0 < confidence < 1:
        raise ValueError(f"t_interval: confidence must be in (0, 1), got {confidence}")
    xs = _finite(values, "t_interval")
    mean = float(xs.mean())
    if xs.size == 1:
        return Interval(mean, None, None, 1, tuple(xs.tolist()))
    half = (
        float(scipy_stats.t.ppf((1 + confidence) / 2, xs.size - 1))
        * float(xs.std(ddof=1))
        / math.sqrt(xs.size)
    )
    return Interval(mean, mean - half, mean + half, int(xs.size), tuple(xs.tolist()))


def sign_flip_p_rows(d: np.ndarray, *, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """The sign-flip p of each row of ``d`` (``[rows, n]``): exact over all ``2^n`` sign assignments up to
    :data:`EXACT_SIGN_FLIP_MAX_N` columns (rows in chunks, so 2^16 assignments stay in memory), else
    ``(1 + hits) / (1 + resamples)`` over ``resamples`` random assignments drawn from ``rng``."""
    n = d.shape[1]
    exact = n <= EXACT_SIGN_FLIP_MAX_N
    signs = (
        np.array(list(itertools.product((1.0, -1.0), repeat=n)))
        if exact
        else rng.choice((1.0, -1.0), (resamples, n))
    )
    hits = np.empty(d.shape[0])
    chunk = max(1, 2**22 // len(signs))
    for start in range(0, d.shape[0], chunk):
        part = d[start : start + chunk]
        hits[start : start + chunk] = np.sum(
            np.abs(part @ signs.T) >= np.abs(part.sum(axis=1))[:, None] - _TIE, axis=1
        )
    return hits / len(signs) if exact else (1 + hits) / (1 + resamples)


def sign_flip_p(
    differences: Sequence[float], *, resamples: int = SIGN_FLIP_RESAMPLES, seed: int = DEFAULT_BOOTSTRAP_SEED
) -> float:
    """Two-sided p of the paired sign-flip (permutation) test: exact over all ``2^n`` sign assignments up to
    :data:`EXACT_SIGN_FLIP_MAX_N` differences, else Monte Carlo with ``resamples`` draws (module docstring)."""
    d = _finite(differences, "sign_flip_p")
    return float(sign_flip_p_rows(d[None, :], resamples=resamples, rng=np.random.default_rng(seed))[0])


def paired_t_p(differences: Sequence[float]) -> float | None:
    """Two-sided p of Student's one-sample t-test of mean 0 on the paired differences; None with one value.
    Differences with no spread (to rounding) give 1 when they are all 0 and 0 otherwise (the t statistic is 0 or infinite)."""
    d = _finite(differences, "paired_t_p")
    if d.size < 2:
        return None
    if float(d.std(ddof=1)) <= _TIE * max(1.0, abs(float(d.mean()))):
        return 1.0 if abs(float(d.mean())) <= _TIE else 0.0
    return float(scipy_stats.ttest_1samp(d, 0.0).pvalue)


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values, in the input's order; None entries are not comparisons and stay None.

    With the ``m`` p-values sorted, ``p_(1) <= ... <= p_(m)``: ``adj_(i) = max_{j <= i} min(1, (m - j + 1) p_(j))``.
    """
    indexed = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    m = len(indexed)
    adjusted: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(indexed):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


def iqm(values: Sequence[float]) -> float:
    """Interquartile mean: the mean of the middle 50% of the values (``scipy.stats.trim_mean(x, 0.25)``, as
    rliable computes it; with fewer than 4 values nothing is trimmed)."""
    return float(scipy_stats.trim_mean(_finite(values, "iqm"), 0.25))


def _improvement(x: np.ndarray, y: np.ndarray) -> float:
    diff = x[:, None] - y[None, :]
    return float(np.mean(np.where(np.abs(diff) <= _TIE, 0.5, (diff > 0).astype(np.float64))))


def probability_of_improvement(
    x: Sequence[float],
    y: Sequence[float],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = DEFAULT_BOOTSTRAP_SEED,
) -> dict:
    """rliable's ``P(X > Y)`` between the runs of two methods, ties counting one half, with a percentile interval
    from resampling each method's runs with replacement (stratified by method)."""
    xs, ys = _finite(x, "probability_of_improvement"), _finite(y, "probability_of_improvement")
    rng = np.random.default_rng(seed)
    xi = rng.integers(0, xs.size, size=(resamples, xs.size))
    yi = rng.integers(0, ys.size, size=(resamples, ys.size))
    diff = xs[xi][:, :, None] - ys[yi][:, None, :]
    boot = np.where(np.abs(diff) <= _TIE, 0.5, (diff > 0).astype(np.float64)).mean(axis=(1, 2))
    alpha = (1 - confidence) / 2
    low, high = np.percentile(boot, [100 * alpha, 100 * (1 - alpha)])
    return {
        "p": _improvement(xs, ys),
        "low": float(low),
        "high": float(high),
        "interval": "stratified bootstrap",
    }


def two_way_bootstrap(
    differences: np.ndarray,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = DEFAULT_BOOTSTRAP_SEED,
) -> dict:
    """Mean of a ``[seeds, problems]`` matrix of paired differences, with the percentile interval of resampling
    seeds and problems independently: a resample's mean is ``c_s^T D c_p / (S P)`` with ``c_s``, ``c_p`` the
    multiplicities of each seed and problem drawn."""
    d = np.asarray(differences, dtype=np.float64)
    if d.ndim != 2 or d.size == 0:
        raise ValueError(
            f"two_way_bootstrap: expected a non-empty seeds x problems matrix, got shape {d.shape}"
        )
    seeds, problems = d.shape
    rng = np.random.default_rng(seed)
    seed_counts = np.stack(
        [np.bincount(row, minlength=seeds) for row in rng.integers(0, seeds, (resamples, seeds))]
    )
    problem_counts = np.stack(
        [np.bincount(row, minlength=problems) for row in rng.integers(0, problems, (resamples, problems))]
    )
    means = np.einsum("bs,sp,bp->b", seed_counts, d, problem_counts) / (seeds * problems)
    alpha = (1 - confidence) / 2
    low, high = np.percentile(means, [100 * alpha, 100 * (1 - alpha)])
    return {"mean": float(d.mean()), "low": float(low), "high": float(high), "interval": "two-way bootstrap"}
