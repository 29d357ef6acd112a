"""Uncertainty over seeds: the percentile bootstrap of the mean.

With ``n`` seeds ``x_1..x_n`` of one method on one metric, a bootstrap resample draws ``n`` values with
replacement and takes their mean; repeating that ``resamples`` times gives the bootstrap distribution of the mean,
and its ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` percentiles are the interval (Efron & Tibshirani,
*An Introduction to the Bootstrap*, 1993, ch. 13: the percentile interval).

Readings, stated because they change the numbers:
- The unit resampled is the *seed*: each seed's value is one whole run's result (e.g. its held-out accuracy), so
  the interval describes run-to-run variation, not the variation of problems within one evaluation.
- The resampling is seeded (``numpy.random.default_rng(seed)``, 10,000 resamples by default) so the same inputs
  always give the same interval, and the percentiles use numpy's default linear interpolation.
- The percentile interval of a mean of ``n`` draws always lies within ``[min(x), max(x)]``. With 3 seeds it is
  coarse (the bootstrap mean takes only 10 distinct values); it is reported anyway, with ``n``, because a reader
  can judge a wide interval but not a hidden one. One seed gives the degenerate interval ``[x, x]``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_RESAMPLES = 10_000
DEFAULT_CONFIDENCE = 0.95
DEFAULT_BOOTSTRAP_SEED = 0


@dataclass(frozen=True)
class Interval:
    """Mean of ``values`` with its bootstrap interval ``[low, high]``."""

    mean: float
    low: float
    high: float
    n: int
    values: tuple[float, ...]

    def to_dict(self) -> dict:
        return {
            "mean": self.mean,
            "low": self.low,
            "high": self.high,
            "n": self.n,
            "values": list(self.values),
        }


def bootstrap_interval(
    values: Sequence[float],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = DEFAULT_BOOTSTRAP_SEED,
) -> Interval:
    """Mean and percentile-bootstrap interval of the mean of ``values`` (one value per seed)."""
    xs = [float(v) for v in values]
    if not xs:
        raise ValueError("bootstrap_interval: no values (expected one value per seed)")
    bad = [v for v in xs if not math.isfinite(v)]
    if bad:
        raise ValueError(f"bootstrap_interval: values must be finite numbers, got {bad}")
    if resamples < 1:
        raise ValueError(f"bootstrap_interval: resamples must be >= 1, got {resamples}")
    if not 0 < confidence < 1:
        raise ValueError(f"bootstrap_interval: confidence must be in (0, 1), got {confidence}")
    data = np.asarray(xs, dtype=np.float64)
    mean = float(data.mean())
    if len(xs) == 1:
        return Interval(mean, mean, mean, 1, tuple(xs))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(xs), size=(resamples, len(xs)))
    means = data[idx].mean(axis=1)
    alpha = (1 - confidence) / 2
    low, high = np.percentile(means, [100 * alpha, 100 * (1 - alpha)])
    return Interval(mean, float(low), float(high), len(xs), tuple(xs))
