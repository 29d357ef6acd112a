"""pass@k and avg@k from per-problem sample counts.

``pass@k`` is the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained on Code",
arXiv 2107.03374, Eq. 1): draw ``n >= k`` samples of a problem, count the ``c`` correct ones, and estimate the
probability that at least one of ``k`` samples is correct as

    pass@k = 1 - C(n - c, k) / C(n, k)

averaged over problems. ``avg@k`` (TEPO 2510.09369 Sec. 4.1: AIME/AMC at temperature 0.6, 32 samples) is the
mean accuracy of the ``k = n`` samples, ``c / n``, averaged over problems; it equals the unbiased pass@1.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np

__all__ = ["avg_at_k", "cons_at_k", "mean_cons_at_k", "mean_pass_at_k", "pass_at_k", "pass_at_k_per_problem"]


def _as_count(value: object, label: str, where: str = "") -> int:
    # bool is an Integral in Python; a count given as True/False is almost surely a mix-up of c with "correct".
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{label} must be an integer{where}, got {value!r}")
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real) and float(value).is_integer():  # 4.0 from a float array is fine
        return int(value)
    raise ValueError(f"{label} must be an integer{where}, got {value!r}")


def _check(n: int, c: int, k: int, where: str = "", metric: str = "pass@k") -> None:
    if n < 1:
        raise ValueError(f"{metric} needs n >= 1 samples{where}, got n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"{metric} needs 0 <= c <= n correct samples{where}, got c={c}, n={n}")
    if k < 1:
        raise ValueError(f"pass@k needs k >= 1, got k={k}")
    if k > n:
        raise ValueError(f"pass@k needs k <= n (at least k samples per problem){where}: got k={k}, n={n}")


def pass_at_k(n: int, c: int, k: int) -> float:
    r"""Unbiased pass@k of one problem with ``n`` samples, ``c`` of them correct (Chen et al. 2107.03374 Eq. 1).

    .. math:: \text{pass@}k = 1 - \binom{n-c}{k} \Big/ \binom{n}{k}
              = 1 - \prod_{i=n-c+1}^{n} \left(1 - \frac{k}{i}\right) \quad (n - c \ge k), \qquad 1 \quad (n - c < k)

    The product form (the one in the paper's numpy snippet) never forms the binomials, which overflow
    floats for n in the hundreds. Example: n = 4, c = 1, k = 2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5;
    product form 1 - (1 - 2/4) = 0.5. Requires 1 <= k <= n and 0 <= c <= n; k > n raises ``ValueError``.
    """
    n = _as_count(n, "n")
    c = _as_count(c, "c")
    k = _as_count(k, "k")
    _check(n, c, k)
    return _pass_at_k_unchecked(n, c, k)


def _pass_at_k_unchecked(n: int, c: int, k: int) -> float:
    if n - c < k:  # every draw of k samples contains a correct one
        return 1.0
    i = np.arange(n - c + 1, n + 1, dtype=np.float64)
    return float(1.0 - np.prod(1.0 - k / i))


def _broadcast_counts(num_samples: int | Sequence[int] | np.ndarray, num_correct: Sequence[int] | np.ndarray):
    correct = np.asarray(num_correct)
    if correct.ndim != 1:
        raise ValueError(
            f"num_correct must be a 1-D sequence (one count per problem), got shape {correct.shape}"
        )
    if np.ndim(num_samples) == 0:
        samples = np.full(correct.shape, num_samples, dtype=object)
    else:
        samples = np.asarray(num_samples)
        if samples.shape != correct.shape:
            raise ValueError(
                f"num_samples has {samples.shape[0] if samples.ndim == 1 else samples.shape} entries but "
                f"num_correct has {correct.shape[0]}; give one count per problem (or a single int for num_samples)"
            )
    pairs = []
    for idx, (n, c) in enumerate(zip(samples.tolist(), correct.tolist())):
        where = f" (problem index {idx})"
        pairs.append((_as_count(n, "num_samples", where), _as_count(c, "num_correct", where)))
    return pairs


def pass_at_k_per_problem(
    num_samples: int | Sequence[int] | np.ndarray, num_correct: Sequence[int] | np.ndarray, k: int
) -> np.ndarray:
    """Unbiased pass@k of each problem (``pass_at_k`` applied elementwise), float64 array of one value per problem.

    ``num_samples`` is one int shared by all problems or one per problem; ``num_correct`` one per problem.
    An invalid entry raises ``ValueError`` naming its problem index.
    """
    k = _as_count(k, "k")
    pairs = _broadcast_counts(num_samples, num_correct)
    for idx, (n, c) in enumerate(pairs):
        _check(n, c, k, f" (problem index {idx})")
    return np.array([_pass_at_k_unchecked(n, c, k) for n, c in pairs], dtype=np.float64)


def mean_pass_at_k(
    num_samples: int | Sequence[int] | np.ndarray, num_correct: Sequence[int] | np.ndarray, k: int
) -> float:
    """pass@k of a benchmark: the mean over problems of the per-problem unbiased estimate."""
    values = pass_at_k_per_problem(num_samples, num_correct, k)
    if values.size == 0:
        raise ValueError("pass@k of an empty benchmark is undefined: no problems given")
    return float(values.mean())


def avg_at_k(num_samples: int | Sequence[int] | np.ndarray, num_correct: Sequence[int] | np.ndarray) -> float:
    r"""avg@k: mean over problems of the accuracy ``c_j / n_j`` of each problem's ``n_j = k`` samples.

    .. math:: \text{avg@}k = \frac{1}{P} \sum_{j=1}^{P} \frac{c_j}{n_j}

    (TEPO 2510.09369 Sec. 4.1 reports avg@32 on AIME/AMC.) Equal to ``mean_pass_at_k(..., k=1)``.
    """
    pairs = _broadcast_counts(num_samples, num_correct)
    if not pairs:
        raise ValueError("avg@k of an empty benchmark is undefined: no problems given")
    for idx, (n, c) in enumerate(pairs):
        _check(n, c, 1, f" (problem index {idx})", metric="avg@k")
    return float(np.mean([c / n for n, c in pairs]))


def cons_at_k(votes: Sequence[object], correct: Sequence[bool], k: int) -> float:
    r"""cons@k (majority vote) of one problem, averaged exactly over all ``C(n, k)`` subsets of its ``n`` samples.

    ``votes[i]`` is the answer class of sample ``i`` (any hashable; samples whose answers are equivalent share a
    class; ``None``: no answer, it does not vote), ``correct[i]`` its verdict. Every sample of a class must have
    the same verdict (the correct answers form one class). For a subset ``S`` of ``k`` samples, the majority
    answer is the class with the most votes in ``S``; the subset scores

    .. math:: s(S) = \begin{cases} 1/t & \text{the correct class is among the } t \text{ classes tied for most
              votes in } S \\ 0 & \text{otherwise, or when no sample of } S \text{ has an answer} \end{cases}

    Tie rule: a tie between ``t`` classes is broken uniformly at random, so it scores its expected value ``1/t``.
    cons@k is :math:`\binom{n}{k}^{-1} \sum_{|S| = k} s(S)` (NeMo-RL's ``cons@k`` averages over all
    ``k``-subsets; verl's ``maj@N`` bootstraps the same quantity). Computed in exact integer arithmetic, without
    enumerating the subsets: with ``x`` votes for the correct class, count the ways the other classes take at most
    ``x`` votes each (``j`` of them exactly ``x``) and the rest go to samples without an answer. Example: votes
    (a, a, b, c), a correct, k = 2: of the 6 pairs, (a, a) scores 1, the four (a, b|c) pairs score 1/2 each,
    (b, c) 0: cons@2 = 3/6 = 0.5. cons@1 equals avg@n (the accuracy of one sample).
    """
    from fractions import Fraction
    from math import comb

    votes, correct = list(votes), [bool(c) for c in correct]
    k = _as_count(k, "k")
    n = len(votes)
    if len(correct) != n:
        raise ValueError(f"cons@k: got {n} votes but {len(correct)} verdicts; give one per sample")
    if n == 0:
        raise ValueError("cons@k needs n >= 1 samples, got none")
    if not 1 <= k <= n:
        raise ValueError(f"cons@k needs 1 <= k <= n (at least k samples per problem): got k={k}, n={n}")
    sizes: dict[object, int] = {}
    verdict: dict[object, bool] = {}
    for vote, ok in zip(votes, correct):
        if vote is None:
            if ok:
                raise ValueError("cons@k: a sample without an answer (vote None) cannot be correct")
            continue
        if verdict.setdefault(vote, ok) != ok:
            raise ValueError(f"cons@k: answer class {vote!r} holds both correct and wrong samples")
        sizes[vote] = sizes.get(vote, 0) + 1
    unanswered = n - sum(sizes.values())
    right = [c for c, ok in verdict.items() if ok]
    if not right:
        return 0.0
    n_c = sizes[right[0]]
    others = [size for c, size in sizes.items() if c != right[0]]
    total = Fraction(0)
    for x in range(1, min(k, n_c) + 1):
        # ways[(picked, tied)]: subsets of the other classes with `picked` samples, each class at most x votes,
        # `tied` of them exactly x.
        ways: dict[tuple[int, int], int] = {(0, 0): 1}
        for size in others:
            step: dict[tuple[int, int], int] = {}
            for (picked, tied), count in ways.items():
                for y in range(0, min(x, size, k - x - picked) + 1):
                    key = (picked + y, tied + (y == x))
                    step[key] = step.get(key, 0) + count * comb(size, y)
            ways = step
        for (picked, tied), count in ways.items():
            rest = k - x - picked
            if 0 <= rest <= unanswered:
                total += Fraction(comb(n_c, x) * count * comb(unanswered, rest), tied + 1)
    return float(total / comb(n, k))


def mean_cons_at_k(problems: Sequence[tuple[Sequence[object], Sequence[bool]]], k: int) -> float:
    """cons@k of a benchmark: the mean over problems of :func:`cons_at_k` (``problems``: ``(votes, correct)``)."""
    if not problems:
        raise ValueError("cons@k of an empty benchmark is undefined: no problems given")
    return float(np.mean([cons_at_k(votes, correct, k) for votes, correct in problems]))
